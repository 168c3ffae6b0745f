"""Markdown tables (docs/attention-core-bench.md) from magicpig_attn_core_bench output.

Reads the `_median` lines of a run with --benchmark_repetitions and prints five tables: full vs
the probe, magicpig(K, L) vs full with the gather floor, the retrieval against its random-line
floor (where the run has those counters), magicpig(10, 150) over blocks of keys (MagicPigBlocks),
and the table build vs ten key reads.

usage: python3 bench/attn_core_tables.py BENCH_OUTPUT.txt
"""
import re
import sys


def parse(path):
    rows = {}
    for line in open(path):
        if "_median" not in line:
            continue
        name = line.split()[0].replace("/manual_time_median", "").replace("/real_time_median", "")
        counters = {k: float(v) * (1000 if kilo else 1)
                    for k, v, kilo in re.findall(r"(\w+)=([0-9.]+)(k?)", line)}
        t = re.search(r"\s([0-9.]+) (us|ms)\s", line)
        ms = float(t.group(1)) / (1000 if t.group(2) == "us" else 1)
        rows[name] = (ms, counters)
    return rows


def main():
    rows = parse(sys.argv[1])
    sizes = [16384, 32768, 65536, 131072]
    configs = [(10, 150), (9, 120), (8, 75)]
    print("| n | threads | full ms | full GB/s | probe GB/s | of probe |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        for t in [1, 2]:
            key = f"Full/n:{n}/threads:{t}"
            if key in rows:
                ms, c = rows[key]
                print(f"| {n // 1024}K | {t} | {ms:.1f} | {c['GBps']:.2f} | {c['probe_GBps']:.2f} "
                      f"| {c['of_probe'] * 100:.0f}% |")
    print()
    print("| n | (K, L) | threads | magicpig ms | frac | union | retrieval ms | gather floor ms "
          "| full ms | speedup | bound | step |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        for k, l in configs:
            for t in [1, 2]:
                key = f"MagicPig/n:{n}/K:{k}/L:{l}/threads:{t}"
                if key not in rows:
                    continue
                ms, c = rows[key]
                b = "**" if (n, k, l) == (65536, 10, 150) else ""
                print(f"| {b}{n // 1024}K{b} | {b}({k}, {l}){b} | {t} | {ms:.2f} "
                      f"| {c['frac'] * 100:.2f}% | {c['union_frac'] * 100:.1f}% "
                      f"| {c['retr_cpu_ms']:.2f} | {c['gather_floor_ms']:.2f} | {c['full_ms']:.1f} "
                      f"| {b}{c['speedup']:.2f}{b} | {c['speedup_bound']:.1f} "
                      f"| {c['step_speedup']:.2f} |")
    floors = [(n, k, l, t) for n in sizes for k, l in configs for t in [1, 2]
              if "retr_lines" in rows.get(f"MagicPig/n:{n}/K:{k}/L:{l}/threads:{t}", (0, {}))[1]]
    if floors:
        print()
        print("| n | (K, L) | threads | retrieval ms | lines read | line floor ms | retrieval / floor "
              "| gather floor ms | full ms | bound (both floors) |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n, k, l, t in floors:
            ms, c = rows[f"MagicPig/n:{n}/K:{k}/L:{l}/threads:{t}"]
            print(f"| {n // 1024}K | ({k}, {l}) | {t} | {c['retr_cpu_ms']:.2f} "
                  f"| {c['retr_lines'] / 1000:.1f}K | {c['retr_floor_ms']:.2f} "
                  f"| {c['retr_cpu_ms'] / c['retr_floor_ms']:.1f} | {c['gather_floor_ms']:.2f} "
                  f"| {c['full_ms']:.1f} | {c['speedup_bound2']:.1f} |")
    blocked = [key for key in rows if key.startswith("MagicPigBlocks/")]
    if blocked:
        print()
        print("| n | block | blocks | threads | magicpig ms | retrieval ms | full ms | speedup |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for key in blocked:
            n, block, t = (int(x) for x in re.findall(r":(\d+)", key))
            ms, c = rows[key]
            print(f"| {n // 1024}K | {block // 1024}K | {n // block} | {t} | {ms:.2f} "
                  f"| {c['retr_cpu_ms']:.2f} | {c['full_ms']:.1f} | {c['speedup']:.2f} |")
    print()
    print("| (K, L) | threads | build ms | first build ms | key read ms (GB/s) | build / 10 reads "
          "| tables MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k, l in configs:
        for t in [1, 2]:
            key = f"TableBuild/K:{k}/L:{l}/threads:{t}"
            if key in rows:
                ms, c = rows[key]
                print(f"| ({k}, {l}) | {t} | {ms:.0f} | {c['first_build_ms']:.0f} "
                      f"| {c['key_read_ms']:.1f} ({c['key_read_GBps']:.1f}) "
                      f"| {c['build_over_10_reads']:.2f} | {c['table_MiB']:.0f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Differential test of magicpig's json::Parse / json::Serialize against Python's json module.

    json_python_compare.py DRIVER [--seeds 1 2 3] [--count N] [--keep DIR]

Generates a seeded corpus of valid and invalid JSON documents (random values written with random
whitespace, escapes and number forms; byte-level mutations of them; hand-picked edge cases), runs
the C++ driver (magicpig_json_corpus) on it, and checks for every document that

  - magicpig accepts it exactly when the strict reference below accepts it, and
  - for an accepted document, magicpig's re-serialisation is itself accepted by the reference and
    denotes the same value: numbers equal as int64 or double, equal strings, same members in the
    same order (duplicate keys: last value at the first position, in both), and
  - a rejection message names the line and column.

The strict reference is Python's json.loads plus the RFC 8259 rules Python does not enforce:
strict UTF-8 decoding (json.loads(bytes) lets UTF-8-encoded surrogates through), no
NaN/Infinity/-Infinity, no number that overflows a double (Python gives inf for 1e400), no lone
surrogate escapes (Python keeps them as lone code points), and nesting of at most 64 levels
(magicpig's default max_depth); the last two apply to every member, also one whose value a later
duplicate key replaces. A BOM and control characters in strings Python already rejects.

Exit status 0 when everything agrees, 1 on a mismatch (the first 20 are printed), 2 on misuse.
"""

import argparse
import collections
import json
import math
import os
import random
import subprocess
import sys
import tempfile

MAX_DEPTH = 64
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


# --- the strict reference ------------------------------------------------------------------------


class Rejected(ValueError):
    pass


def _reject_constant(name):
    raise Rejected("NaN/Infinity")


def _checked_float(text):
    f = float(text)
    if math.isinf(f):
        raise Rejected("number overflows a double")
    return f


def _checked_int(text):
    i = int(text)
    if not INT64_MIN <= i <= INT64_MAX:
        try:
            float(i)
        except OverflowError:
            raise Rejected("number overflows a double") from None
    return i


class _Pairs(list):
    """An object as parsed: every (key, value) pair, duplicates included."""


def _depth_and_surrogates(value):
    """(nesting depth, whether any string or key holds a lone surrogate), without recursion.

    Duplicate members count too: a lone surrogate or deep nesting in a value that a later duplicate
    key replaces still makes the text invalid."""
    max_depth = 0
    lone = False
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, str):
            lone = lone or any(0xD800 <= ord(c) <= 0xDFFF for c in v)
        elif isinstance(v, _Pairs):
            max_depth = max(max_depth, d + 1)
            for k, e in v:
                lone = lone or any(0xD800 <= ord(c) <= 0xDFFF for c in k)
                stack.append((e, d + 1))
        elif isinstance(v, list):
            max_depth = max(max_depth, d + 1)
            stack.extend((e, d + 1) for e in v)
    return max_depth, lone


def _to_dicts(value):
    """Replaces _Pairs by dicts: the last value of a key wins, at the position of the first."""
    if isinstance(value, _Pairs):
        d = {}
        for k, e in value:
            d[k] = _to_dicts(e)
        return d
    if isinstance(value, list):
        return [_to_dicts(e) for e in value]
    return value


def reference(doc):
    """(True, value) when strict RFC 8259 accepts the bytes, else (False, reason)."""
    try:
        text = doc.decode("utf-8")  # strict: no overlongs, no encoded surrogates, no > U+10FFFF
    except UnicodeDecodeError:
        return False, "invalid UTF-8"
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_checked_float,
                           parse_int=_checked_int, object_pairs_hook=_Pairs)
    except Rejected as e:
        return False, str(e)
    except (ValueError, RecursionError):
        return False, "python json rejects"
    depth, lone = _depth_and_surrogates(value)
    if lone:
        return False, "lone surrogate"
    if depth > MAX_DEPTH:
        return False, "too deep"
    return True, _to_dicts(value)


def canonical(value):
    """A comparable form: numbers by mathematical value, objects as ordered member lists."""
    if value is None or isinstance(value, bool):
        return ("lit", value)
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return ("num", value)
        return ("num", float(value))
    if isinstance(value, float):
        if value.is_integer() and -(2.0**63) <= value < 2.0**63:
            return ("num", int(value))  # also folds -0.0 into 0, as the C++ == does
        return ("num", value)
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, list):
        return ("arr", tuple(canonical(e) for e in value))
    return ("obj", tuple((k, canonical(e)) for k, e in value.items()))


# --- the corpus ----------------------------------------------------------------------------------


class Generator:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def ws(self):
        r = self.r.random()
        if r < 0.7:
            return ""
        return self.r.choice([" ", "\n", "\t", "\r\n", "  ", " \n  ", "\r"])

    def number(self):
        r = self.r
        k = r.randrange(12)
        if k == 0:
            return str(r.randint(-100, 100))
        if k == 1:
            return str(r.choice([INT64_MAX, INT64_MIN, INT64_MAX + 1, INT64_MIN - 1, 2**53 + 1,
                                 2**62, -(2**62) - 1, 10**19, 50256]))
        if k == 2:
            return str(r.randint(-(10**r.randint(1, 30)), 10**r.randint(1, 30)))
        if k == 3:
            return r.choice(["-0", "0", "-0.0", "0.0", "0e0", "-0E-0", "0.000"])
        if k == 4:
            bits = r.getrandbits(64)
            f = math.ldexp(float(bits & ((1 << 53) - 1)), r.randint(-1100, 970))
            return repr(-f if bits >> 63 else f)
        if k == 5:
            return r.choice(["1e308", "1.7976931348623157e308", "1.7976931348623159e308",
                             "1e309", "-1e400", "1e-400", "4.9e-324", "2e-324", "2.4703282292062328e-324",
                             "1e-323", "123456789012345678901234567890",
                             "9007199254740993.0", "0.1", "1E+2", "1e-0007"])
        # A literal assembled from parts: int part, optional fraction, optional exponent.
        s = "-" if r.random() < 0.3 else ""
        s += "0" if r.random() < 0.3 else str(r.randint(1, 10**r.randint(1, 20)))
        if r.random() < 0.5:
            s += "." + "".join(r.choice("0123456789") for _ in range(r.randint(1, 20)))
        if r.random() < 0.5:
            s += r.choice("eE") + r.choice(["", "+", "-"])
            s += str(r.choice([r.randint(0, 30), r.randint(0, 400), r.randint(280, 330)])).zfill(
                r.randint(1, 4))
        return s

    def char(self):
        r = self.r
        k = r.randrange(10)
        if k < 4:
            return r.choice("abcXYZ 019_-+.:,{}[]'")
        if k == 4:
            return chr(r.randint(0x80, 0x7FF))
        if k == 5:
            c = r.randint(0x800, 0xFFFF - 0x800)
            return chr(c + 0x800 if c >= 0xD800 else c)
        if k == 6:
            return chr(r.randint(0x10000, 0x10FFFF))
        if k == 7:
            return r.choice(['\\"', "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"])
        if k == 8:
            c = r.choice([r.randint(0, 0x1F), r.randint(0x20, 0xD7FF), r.randint(0xE000, 0xFFFF),
                          0x22, 0x5C, 0x7F, 0x2028, 0xFEFF])
            h = "%04x" % c
            return "\\u" + "".join(ch.upper() if r.random() < 0.5 else ch for ch in h)
        cp = r.randint(0x10000, 0x10FFFF) - 0x10000
        hi, lo = 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)
        if r.random() < 0.05:  # occasionally a lone or reversed surrogate
            return r.choice(["\\u%04X" % hi, "\\u%04x" % lo, "\\u%04X\\u%04X" % (lo, hi)])
        return "\\u%04X\\u%04x" % (hi, lo)

    def string(self):
        n = self.r.choice([0, 1, 2, 5, 12, 40])
        return '"' + "".join(self.char() for _ in range(self.r.randint(0, n))) + '"'

    def value(self, depth):
        r = self.r
        k = r.randrange(9 if depth > 0 else 6)
        if k == 0:
            return r.choice(["true", "false", "null"])
        if k in (1, 2):
            return self.number()
        if k in (3, 4, 5):
            return self.string()
        if k in (6, 7):
            items = [self.ws() + self.value(depth - 1) + self.ws()
                     for _ in range(r.choice([0, 1, 2, 3, 6]))]
            return "[" + (",".join(items) if items else self.ws()) + "]"
        keys = [self.string() for _ in range(r.choice([0, 1, 2, 3, 6]))]
        if keys and r.random() < 0.2:
            keys.append(r.choice(keys))  # a duplicate key
        members = [self.ws() + k + self.ws() + ":" + self.ws() + self.value(depth - 1) + self.ws()
                   for k in keys]
        return "{" + (",".join(members) if members else self.ws()) + "}"

    def document(self):
        return (self.ws() + self.value(self.r.randint(0, 5)) + self.ws()).encode("utf-8",
                                                                                "surrogatepass")

    INSERTS = [b",", b"]", b"}", b"[", b"{", b'"', b"\\", b"'", b"/", b"0", b"-", b".", b"e",
               b"+", b":", b" ", b"\x00", b"\x01", b"\x1f", b"\x7f", b"\xff", b"\xc3", b"\xe2\x82",
               b"\xed\xa0\x80", b"\xc0\x80", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80", b"\xf0\x9f\x98",
               b"NaN", b"Infinity", b"-Infinity", b"true", b"nul", b"\\u", b"\\ud800",
               b"\\udc00", b"\xef\xbb\xbf", b"\t", b"\n", b"\x0c", b"\xc2\xa0", b"1e400", b"01",
               b"//", b"/*", b"\\x41", b"\\'"]

    def mutate(self, doc):
        r = self.r
        for _ in range(r.choice([1, 1, 1, 2, 3])):
            i = r.randint(0, len(doc))
            k = r.randrange(6)
            if k == 0 and doc:
                i = min(i, len(doc) - 1)
                doc = doc[:i] + doc[i + 1:]
            elif k in (1, 2):
                doc = doc[:i] + r.choice(self.INSERTS) + doc[i:]
            elif k == 3 and doc:
                i = min(i, len(doc) - 1)
                doc = doc[:i] + bytes([r.randrange(256)]) + doc[i + 1:]
            elif k == 4:
                doc = doc[:i]
            else:
                j = r.randint(i, min(len(doc), i + 8))
                doc = doc[:i] + doc[i:j] + doc[i:j] + doc[j:]
        return doc


def edge_cases():
    docs = [b"", b" ", b"\xef\xbb\xbf{}", b"\xef\xbb\xbf", b"\x00", b"[]\x00", b'"\\u0000"',
            b'"\\ud800"', b'"\\udc00"', b'"\\ud800\\udc00"', b'"\\udbff\\udfff"', b'"\\ud800\\ud800"',
            b'"\xed\xa0\x80"', b'"\xed\x9f\xbf"', b'"\xee\x80\x80"', b'"\xf4\x8f\xbf\xbf"',
            b'"\xf4\x90\x80\x80"', b'"\xc0\x80"', b'"\xc2\x80"', b'"\xe0\x9f\xbf"', b'"\xe0\xa0\x80"',
            b'"\xf0\x8f\xbf\xbf"', b'"\xf0\x90\x80\x80"', b'"\x7f"', b'"\x1f"', b'"\t"',
            b"NaN", b"-NaN", b"Infinity", b"-Infinity", b"[NaN]", b"1e400", b"-1e400", b"1e-400",
            b"1.7976931348623157e308", b"1.7976931348623158e308", b"1.7976931348623159e308",
            b"1" + b"0" * 308, b"1" + b"0" * 309, b"-0", b"-0.0", b"01", b"1.", b".1", b"+1",
            b"0x1", b"1e", b"1e+", b"[1,]", b'{"a":1,}', b"[1 2]", b'{"a" 1}', b"{'a':1}", b"[1]]",
            b'{"a":1,"a":2,"b":3,"a":4}', b"\f[]", b"\v[]", b"\xc2\xa0[]", b"[]\r\n", b"tru",
            b"true false", b"/**/[]", b"[]//"]
    for depth in (1, 63, 64, 65, 66, 200):
        docs.append(b"[" * depth + b"]" * depth)
        docs.append(b'{"k":' * depth + b"0" + b"}" * depth)
        docs.append(b"[" * depth)
    return docs


def build_corpus(seeds, count):
    docs = edge_cases()
    for seed in seeds:
        gen = Generator(seed)
        valid = [gen.document() for _ in range(count)]
        docs.extend(valid)
        docs.extend(gen.mutate(gen.r.choice(valid)) for _ in range(2 * count))
    return docs


# --- the comparison ------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("driver")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1234, 99, 2024])
    ap.add_argument("--count", type=int, default=2000, help="valid documents per seed")
    ap.add_argument("--keep", help="directory to keep the corpus and the driver output in")
    args = ap.parse_args()

    docs = build_corpus(args.seeds, args.count)
    work = args.keep or tempfile.mkdtemp(prefix="json_compare_")
    os.makedirs(work, exist_ok=True)
    corpus_path = os.path.join(work, "corpus.bin")
    out_path = os.path.join(work, "magicpig.out")
    with open(corpus_path, "wb") as f:
        for d in docs:
            f.write(b"%d\n" % len(d))
            f.write(d)
    subprocess.run([args.driver, corpus_path, out_path], check=True)
    with open(out_path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) != len(docs):
        print(f"FAIL: driver printed {len(lines)} lines for {len(docs)} documents")
        return 1

    mismatches = []
    accepted = 0
    rejected = 0
    reasons = collections.Counter()
    for doc, line in zip(docs, lines):
        ok, ref = reference(doc)
        ours_ok = line.startswith(b"OK ")
        if not ok:
            reasons[ref] += 1
        if ok != ours_ok:
            mismatches.append((doc, f"reference {'accepts' if ok else 'rejects (' + ref + ')'}, "
                                    f"magicpig says {line[:200]!r}"))
            continue
        if not ok:
            rejected += 1
            if b"invalid JSON at line " not in line:
                mismatches.append((doc, f"error without a location: {line[:200]!r}"))
            continue
        accepted += 1
        out = line[3:]
        out_ok, out_value = reference(out)
        if not out_ok:
            mismatches.append((doc, f"magicpig's output {out[:200]!r} is not valid: {out_value}"))
        elif canonical(out_value) != canonical(ref):
            mismatches.append((doc, f"values differ: magicpig wrote {out[:200]!r}"))

    print(f"{len(docs)} documents (seeds {args.seeds}): {accepted} accepted by both, "
          f"{rejected} rejected by both; {len(mismatches)} mismatches")
    print("reference rejections by reason: " +
          ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())))
    for doc, what in mismatches[:20]:
        print(f"MISMATCH {doc[:200]!r}: {what}")
    if not args.keep and not mismatches:
        os.remove(corpus_path)
        os.remove(out_path)
        os.rmdir(work)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

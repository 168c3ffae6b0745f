#!/usr/bin/env python3
"""Tests of the retrieval-structured training documents (eval/spotlight/collect.py --kind
retrieval), with the model's own tokenizer: every planted record appears once in the body and is
asked once in the tail with its own value; the first --tokens tokens are all text (no repetition)
and the last --queries of them fall inside the question tail; the same seed gives the same text.

Usage: collect_test.py MODEL.gguf"""

import os
import random
import re
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "eval", "spotlight"))
sys.path.insert(0, os.path.join(HERE, "..", "tokenizer"))
import collect  # noqa: E402
import hf_reference  # noqa: E402

MODEL = sys.argv.pop(1) if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
TAIL = "\n\nQuestions about the records above"


class RetrievalDocumentTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tok = hf_reference.build(MODEL)
        # A haystack of prose-like lines, long enough for any of the sizes below.
        words = ["alpha", "river", "stone", "window", "quiet", "lantern", "copper", "meadow"]
        rng = random.Random(1)
        cls.hay = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(3000))

    def build(self, tokens, queries, seed):
        return collect.retrieval_document(self.tok, self.hay, tokens, queries, random.Random(seed))

    def test_records_planted_and_asked_once(self):
        text = self.build(2048, 64, 7)
        body, tail = text.split(TAIL)
        planted = {}  # (phrasing, name) -> value, from the body's lines
        for line in body.split("\n"):
            for k, (record, _, _) in enumerate(collect.RECORDS):
                m = pattern(record).fullmatch(line)
                if m:
                    self.assertNotIn((k, m["n"]), planted)
                    planted[(k, m["n"])] = m["v"]
        self.assertEqual(len(planted), 24)
        lines = tail.split("\n")[1:-1]
        self.assertEqual(len(lines), 48)
        asked = set()
        for q_line, a_line in zip(lines[0::2], lines[1::2]):
            k, m = next((k, pattern("Q: " + q).fullmatch(q_line))
                        for k, (_, q, _) in enumerate(collect.RECORDS)
                        if pattern("Q: " + q).fullmatch(q_line))
            self.assertEqual(a_line, f"A: {collect.RECORDS[k][2]} {planted[(k, m['n'])]}.")
            asked.add((k, m["n"]))
        self.assertEqual(asked, set(planted))

    def test_sized_so_the_dumped_queries_fall_in_the_tail(self):
        for tokens, queries, seed in [(2048, 64, 1), (4096, 128, 2), (3000, 100, 3)]:
            text = self.build(tokens, queries, seed)
            ids = self.tok.encode(text, add_special_tokens=False).ids
            self.assertGreaterEqual(len(ids), tokens)  # no repetition in the dump
            body = text.split(TAIL)[0]
            n_body = len(self.tok.encode(body, add_special_tokens=False).ids)
            self.assertLessEqual(n_body, tokens - queries)  # the dumped queries are tail tokens

    def test_deterministic(self):
        self.assertEqual(self.build(2048, 64, 5), self.build(2048, 64, 5))
        self.assertNotEqual(self.build(2048, 64, 5), self.build(2048, 64, 6))


def pattern(template):
    """A regex for the lines `template` writes: {n} a two-word invented name, {v} a value."""
    rx = re.escape(template).replace(r"\{n\}", r"(?P<n>[A-Z][a-z]+ [A-Z][a-z]+)")
    return re.compile(rx.replace(r"\{v\}", r"(?P<v>[0-9a-f]+)"))


if __name__ == "__main__":
    unittest.main()

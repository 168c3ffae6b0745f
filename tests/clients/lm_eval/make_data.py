"""Writes the two small offline datasets of the lm-evaluation-harness tasks in this folder:
capitals_mc.jsonl (log-likelihood, 4 choices) and capitals_gen.jsonl (generate_until, exact
match). Deterministic; facts chosen so that a 135M model has a fair chance on some of them."""
import json
import os
import random

FACTS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
         ("Japan", "Tokyo"), ("Russia", "Moscow"), ("England", "London"), ("Egypt", "Cairo"),
         ("China", "Beijing"), ("Greece", "Athens"), ("Portugal", "Lisbon"),
         ("Austria", "Vienna"), ("Ireland", "Dublin"), ("Norway", "Oslo"),
         ("Sweden", "Stockholm"), ("Poland", "Warsaw"), ("Canada", "Ottawa"),
         ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Cuba", "Havana")]

here = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(42)
cities = [c for _, c in FACTS]
with open(os.path.join(here, "capitals_mc.jsonl"), "w") as mc, \
        open(os.path.join(here, "capitals_gen.jsonl"), "w") as gen:
    for country, city in FACTS:
        wrong = rng.sample([c for c in cities if c != city], 3)
        choices = wrong + [city]
        rng.shuffle(choices)
        mc.write(json.dumps({"question": "The capital of %s is" % country, "choices": choices,
                             "label": choices.index(city)}) + "\n")
        gen.write(json.dumps({"question": "The capital of %s is" % country,
                              "answer": city}) + "\n")

#!/usr/bin/env python3
"""Writes buried_fact.txt: a long passage (about 4K tokens) with one fact buried in the middle and a
question about it at the end. Deterministic (fixed seed); the text is our own."""
import random

SUBJECTS = ["The harbour master", "A travelling merchant", "The village baker", "An old fisherman",
            "The schoolteacher", "A young apprentice", "The mayor of Eastbrook", "A retired sailor",
            "The librarian", "A shepherd from the hills", "The blacksmith", "A visiting painter"]
VERBS = ["walked along", "spoke at length about", "wrote a letter describing", "remembered",
         "sketched", "complained about", "told a long story about", "repaired", "counted",
         "sang a song about", "argued over", "carefully measured"]
OBJECTS = ["the stone bridge over the river", "the autumn market in the square",
           "the grey boats in the harbour", "the old clock tower", "the winter storms of last year",
           "the orchard behind the chapel", "the narrow road to the mill",
           "the lanterns along the pier", "the price of wool and salt", "the herons on the marsh",
           "the new roof of the town hall", "the wooden carts of the farmers"]
ENDINGS = ["while the tide came in.", "before the evening bells rang.",
           "and nobody seemed to mind.", "as the rain drifted over the fields.",
           "under a pale and quiet sky.", "long after the lamps were lit.",
           "with great patience.", "and then went home for supper."]
FACT = "Remember this: the secret password for the harbour gate is \"silver lantern\"."
QUESTION = "What is the secret password for the harbour gate?"


def main():
    rng = random.Random(20261121)
    sentences = []
    for _ in range(200):
        sentences.append(f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
                         f"{rng.choice(ENDINGS)}")
    sentences.insert(len(sentences) // 2, FACT)
    paragraphs = [" ".join(sentences[i:i + 6]) for i in range(0, len(sentences), 6)]
    text = "Read the following notes about the town of Eastbrook.\n\n" + "\n\n".join(paragraphs)
    text += f"\n\nAnswer the question using the notes above. {QUESTION}"
    with open("buried_fact.txt", "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compares magicpig's chat-template rendering with the model's own Jinja template.

The reference renders `tokenizer.chat_template` (read with the PyPI `gguf` package) with `jinja2`
configured as Hugging Face transformers' apply_chat_template does (sandboxed, trim_blocks,
lstrip_blocks, add_generation_prompt=True, no tools). The conversations cover: no system message
(the template's default system text), a given system message, several turns, empty content,
newlines, non-ASCII text and special-token text inside content.

Usage: compare_chat.py MODEL.gguf RENDER_TOOL
Exit 0 when every conversation renders identically, 1 otherwise.
"""
import json
import subprocess
import sys
import tempfile

from gguf import GGUFReader
from jinja2.sandbox import ImmutableSandboxedEnvironment

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
    [{"role": "user", "content": "line one\nline two\n\n  indented\ttab"}],
    [{"role": "user", "content": "Ünïcödé — 日本語 — emoji 🐷"}],
    [{"role": "user", "content": "<|im_start|>system\nignore<|im_end|> <|endoftext|>"}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}],
    [{"role": "user", "content": "  leading and trailing spaces  "}],
]


def main():
    model, tool = sys.argv[1], sys.argv[2]
    reader = GGUFReader(model)
    template = reader.fields["tokenizer.chat_template"].contents()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):
        raise RuntimeError(message)

    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/in.json", "w", encoding="utf-8") as f:
            json.dump(CONVERSATIONS, f)
        subprocess.run([tool, model, f"{tmp}/in.json", f"{tmp}/out.json"], check=True)
        with open(f"{tmp}/out.json", encoding="utf-8") as f:
            ours = json.load(f)
    ok = True
    for i, conv in enumerate(CONVERSATIONS):
        expected = compiled.render(messages=conv, add_generation_prompt=True, tools=None,
                                   bos_token="", eos_token="")
        same = ours[i] == expected
        ok &= same
        print(f"conversation {i} ({len(conv)} messages): {'identical' if same else 'DIFFERENT'}")
        if not same:
            print(f"  jinja2:   {expected!r}\n  magicpig: {ours[i]!r}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

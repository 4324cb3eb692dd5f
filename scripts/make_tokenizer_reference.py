#!/usr/bin/env python3
"""Writes the reference ids and prompts that the runtime's tokenizer tests compare against.

Run in a venv with `tokenizers` and `transformers` from PyPI (versions recorded in the
output), after scripts/fetch_tokenizers.sh:

    python scripts/make_tokenizer_reference.py [--assets DIR] [--tiny-moe DIR]

Writes two small files under crates/runtime/tests/data/:
- tokenizer_reference.json: for the Qwen3 and DeepSeek-V3 tokenizer.json files, the ids that
  Python `tokenizers` gives each text of a varied set (multilingual, code, emoji with ZWJ
  sequences, special tokens, whitespace runs, numbers) with add_special_tokens=False, and
  the text `decode` gives back (skip_special_tokens=False).
- chat_template_reference.json: for Qwen3, DeepSeek-V3 and strata-tiny-moe, conversations
  rendered by transformers' `apply_chat_template` (jinja2), and the ids of the rendered
  prompt (`tokenize=True`).
- strata-tiny-moe/: that model's tokenizer files (550 KB, so the tests run on a fresh clone
  without ../shared) and its reference prompts, prompt ids and greedy continuations
  (reference_prompts.json, from its reference/reference.json).

Tool definitions are written with their keys in sorted order at every level: the Rust side
holds JSON objects in serde_json's sorted maps, so `tojson` can only agree on key order
when the input is sorted.
"""

import argparse
import hashlib
import json
import os
import pathlib
import shutil

import tokenizers
import transformers
from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "crates" / "runtime" / "tests" / "data"

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and   multiple   spaces  ",
    "tabs\tand\nnewlines\r\nand\n\n\nblank lines",
    "a" + " " * 17 + "b" + "\t" * 5 + "c\n \n\t \t\n",
    "1234567890 3.14159 -42 1e-10 0x1F 1,000,000 2024-11-22 12:30:45",
    "31415926535897932384626433832795028841971",
    "你好，世界！今天天气怎么样？我想学习机器学习和深度学习。",
    "東京は日本の首都です。ひらがなとカタカナ、ｶﾀｶﾅも。",
    "안녕하세요, 만나서 반갑습니다. 한국어 텍스트입니다.",
    "مرحبا بالعالم! كيف حالك اليوم؟ مُحَمَّد",
    "नमस्ते दुनिया, आप कैसे हैं? हिन्दी में लिखा गया वाक्य।",
    "สวัสดีครับ ยินดีที่ได้รู้จัก",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Ἐν ἀρχῇ ἦν ὁ λόγος · Größe, Übermaß · déjà vu, naïve café, Ærøskøbing",
    "e\u0301 vs \u00e9, A\u030a vs \u00c5, \u1100\u1161 vs \uac00",
    "I love 🍕 and 🎉! 😀😃😄 🤖",
    "👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder, 🏳️‍🌈 flag, 🇫🇷🇯🇵 flags, 👍🏿 ❤️‍🔥",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{:?}\", v);\n}\n",
    '{"key": [1, 2, {"nested": null}], "ok": true, "pi": 3.14}',
    '<a href="https://example.com/path?q=1&r=2#frag">link</a> mailto:someone@example.org',
    "# Title\n\n- item 1\n- item 2\n\n```python\nprint('hi')\n```\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me reason.\n</think>\n\nThe answer is 4.",
    "x<|endoftext|>y <|im_end|> z<|im_start|>",
    "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜>",
    "I'm sure you'll see they've gone, it's John's. DON'T SHOUT'S I'D WE'LL",
    "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "∫₀^∞ e^{-x²} dx = √π/2, ∑ᵢ aᵢ ≤ ∞, α β γ → ⇒ ∀x∃y",
    "Mixed 中文 English العربية हिन्दी 123 🙂 end",
    "!!!!!!!!!!?????...... ------ ====== ______ ***",
    "",
    " ",
    "\n",
    "\u0000\u0001\u001b[31mred\u001b[0m\u007f",
    "\ufeffBOM \u200bzero-width \u00a0nbsp \u2028line-sep",
    "ＡＢＣ１２３！ full width",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 𠜎 𝟙𝟚𝟛",
    "In 1905, Einstein published four papers. They changed physics: E = mc^2, "
    "the photoelectric effect, Brownian motion and special relativity.",
]

# Keys sorted at every level (see the module docstring).
WEATHER_TOOL = {
    "function": {
        "description": "Get the current weather in a city",
        "name": "get_weather",
        "parameters": {
            "properties": {
                "city": {"description": "City name", "type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"], "type": "string"},
            },
            "required": ["city"],
            "type": "object",
        },
    },
    "type": "function",
}

BASIC = [
    {"role": "user", "content": "Hello! How are you?"},
]
MULTI = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3? Answer in 中文 please 🙂"},
]
THINKING_HISTORY = [
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "<think>\nSmall primes: 2, 3.\n</think>\n\n2"},
    {"role": "user", "content": "Another one."},
]


def conversations(name):
    cases = [
        {"name": "basic", "messages": BASIC, "add_generation_prompt": True},
        {"name": "basic_no_generation_prompt", "messages": BASIC, "add_generation_prompt": False},
        {"name": "multi_turn_system", "messages": MULTI, "add_generation_prompt": True},
    ]
    if name == "qwen3":
        cases += [
            {"name": "thinking_history", "messages": THINKING_HISTORY, "add_generation_prompt": True},
            {
                "name": "enable_thinking_false",
                "messages": BASIC,
                "add_generation_prompt": True,
                "extra": {"enable_thinking": False},
            },
            {
                "name": "tools_and_tool_call",
                "messages": [
                    {"role": "system", "content": "You can call tools."},
                    {"role": "user", "content": "Weather in Paris?"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "function": {
                                    "arguments": {"city": "Paris", "unit": "celsius"},
                                    "name": "get_weather",
                                },
                                "type": "function",
                            }
                        ],
                    },
                    {"role": "tool", "content": '{"temperature": 18}'},
                ],
                "add_generation_prompt": True,
                "extra": {"tools": [WEATHER_TOOL]},
            },
        ]
    if name == "deepseek_v3":
        # (A tool-call turn with `content: None` is not rendered: transformers 5 drops the
        # None before rendering and this template then fails in Python too.)
        cases += [
            {
                "name": "two_system_messages",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "system", "content": "Use metric units."},
                    {"role": "user", "content": "How tall is Everest?"},
                    {"role": "assistant", "content": "8,849 m."},
                    {"role": "user", "content": "And K2?"},
                ],
                "add_generation_prompt": True,
            },
        ]
    return cases


def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_assets = os.environ.get("STRATA_ASSETS", str(ROOT / ".cache" / "assets"))
    parser.add_argument("--assets", default=default_assets, help="STRATA_ASSETS directory")
    parser.add_argument(
        "--tiny-moe",
        default=str(ROOT.parent / "shared" / "models" / "strata-tiny-moe"),
        help="strata-tiny-moe model directory",
    )
    args = parser.parse_args()
    tok_dir = pathlib.Path(args.assets) / "tokenizers"

    ids_out = {
        "generator": "scripts/make_tokenizer_reference.py",
        "tokenizers_version": tokenizers.__version__,
        "texts": TEXTS,
        "tokenizers": {},
    }
    for name in ["qwen3", "deepseek_v3"]:
        path = tok_dir / name / "tokenizer.json"
        tok = tokenizers.Tokenizer.from_file(str(path))
        ids = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
        ids_out["tokenizers"][name] = {
            "tokenizer_json_sha256": sha256(path),
            "ids": ids,
            "decoded": [tok.decode(i, skip_special_tokens=False) for i in ids],
        }

    tpl_out = {
        "generator": "scripts/make_tokenizer_reference.py",
        "transformers_version": transformers.__version__,
        "models": {},
    }
    model_dirs = {
        "qwen3": tok_dir / "qwen3",
        "deepseek_v3": tok_dir / "deepseek_v3",
        "strata_tiny_moe": pathlib.Path(args.tiny_moe),
    }
    for name, d in model_dirs.items():
        tok = AutoTokenizer.from_pretrained(str(d))
        cases = []
        for case in conversations(name):
            extra = dict(case.get("extra", {}))
            tools = extra.pop("tools", None)
            kwargs = dict(
                add_generation_prompt=case["add_generation_prompt"], tools=tools, **extra
            )
            text = tok.apply_chat_template(case["messages"], tokenize=False, **kwargs)
            ids = tok.apply_chat_template(case["messages"], tokenize=True, return_dict=True, **kwargs)[
                "input_ids"
            ]
            cases.append({**case, "expected": text, "expected_ids": list(ids)})
        tpl_out["models"][name] = cases

    DATA.mkdir(parents=True, exist_ok=True)
    tiny = pathlib.Path(args.tiny_moe)
    tiny_out = DATA / "strata-tiny-moe"
    tiny_out.mkdir(exist_ok=True)
    for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copyfile(tiny / file, tiny_out / file)
    reference = json.loads((tiny / "reference" / "reference.json").read_text())
    with open(tiny_out / "reference_prompts.json", "w", encoding="utf-8") as f:
        json.dump({"source": "strata-tiny-moe/reference/reference.json", "prompts": reference["prompts"]},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    for file, obj in [
        ("tokenizer_reference.json", ids_out),
        ("chat_template_reference.json", tpl_out),
    ]:
        path = DATA / file
        with open(path, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

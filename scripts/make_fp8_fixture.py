#!/usr/bin/env python3
"""Build the DeepSeek-V3 FP8 fixture: the `deepseek_v3` fixture's linear weights stored as
float8_e4m3fn with `weight_scale_inv` block scales, as DeepSeek-V3/R1 checkpoints ship them.

The reference logits come from transformers running the *dequantized* weights in float32
(`w = fp8.float() * scale_inv` per block), so the fixture checks that Strata decodes FP8 and
applies block scales exactly as DeepSeek's checkpoints define them. Blocks are 8 x 8 here (the
real models use 128 x 128; the block size is read from `quantization_config.weight_block_size`)
so that the tiny matrices have many blocks, including partial ones at the edges.

Usage: ``.venv/bin/python scripts/make_fp8_fixture.py`` (after make_fixtures.py)
"""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tests/fixtures/deepseek_v3"
DST = ROOT / "tests/fixtures/deepseek_v3_fp8"
BLOCK = (8, 8)
FP8_MAX = 448.0


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    bn, bk = BLOCK
    rows, cols = math.ceil(n / bn), math.ceil(k / bk)
    scale = torch.zeros(rows, cols, dtype=torch.float32)
    q = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    for i in range(rows):
        for j in range(cols):
            blk = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk]
            s = blk.abs().max().item() / FP8_MAX or 1.0
            scale[i, j] = s
            q[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    bn, bk = BLOCK
    s = scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return q.float() * s


def is_quantized(name: str, t: torch.Tensor) -> bool:
    # DeepSeek's FP8 checkpoints quantize every linear projection except the router and the
    # embeddings / LM head; norms stay in higher precision.
    return (
        t.ndim == 2
        and (name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight"))
        and "embed" not in name
    )


def main() -> None:
    if DST.exists():
        shutil.rmtree(DST)
    DST.mkdir(parents=True)
    tensors = load_file(SRC / "model.safetensors")
    fp8, dequant = {}, {}
    for name, t in tensors.items():
        if is_quantized(name, t):
            q, s = quantize(t.float())
            fp8[name] = q
            fp8[name.replace(".weight", ".weight_scale_inv")] = s
            dequant[name] = dequantize(q, s)
        else:
            fp8[name] = t
            dequant[name] = t
    save_file(fp8, DST / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((SRC / "config.json").read_text())
    config["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": list(BLOCK),
    }
    (DST / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    # Reference: the dequantized weights in float32 through transformers.
    tmp = DST / "_dequantized"
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in dequant.items()}, tmp / "model.safetensors")
    (tmp / "config.json").write_text((SRC / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(
        tmp, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    ref = json.loads((SRC / "reference.json").read_text())
    for i, seq in enumerate(ref["sequences"]):
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0]
        np.save(DST / f"logits_{i}.npy", logits.numpy().astype(np.float32))
    shutil.rmtree(tmp)
    ref["notes"] = (
        "deepseek_v3 with every *_proj weight in float8_e4m3fn and weight_scale_inv 8x8 block "
        "scales; logits from transformers on the dequantized weights in float32"
    )
    ref["weights_dtype"] = "float8_e4m3fn"
    ref.pop("checks", None)
    (DST / "reference.json").write_text(json.dumps(ref, indent=2) + "\n")
    print(f"wrote {DST}")


if __name__ == "__main__":
    main()

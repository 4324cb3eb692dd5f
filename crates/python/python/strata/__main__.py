"""`python -m strata serve --model M [...]`: Strata's OpenAI-compatible server, the same Rust
entry as `strata serve` (strata_server::run), on the CPU."""

import argparse
import sys

from strata._strata import serve


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m strata")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve a model over the OpenAI-compatible HTTP API")
    s.add_argument("--model", "-m", required=True, help="model directory, .gguf or .strata")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--dtype", default="fast", choices=["fast", "f32"])
    s.add_argument("--weights", choices=["bf16", "int8", "int4"])
    s.add_argument("--max-batch", type=int, default=16)
    s.add_argument("--max-queue", type=int, default=256)
    s.add_argument("--ctx-size", type=int, help="context per sequence (default: the model's)")
    s.add_argument("--step-tokens", type=int, default=512)
    s.add_argument("--prefix-cache-mb", type=int, default=1024,
                   help="memory for the shared prefix cache in MiB (0 disables it)")
    s.add_argument("--served-model-name")
    s.add_argument("--expert-cache", metavar="SIZE|auto|off",
                   help="DRAM for a GGUF's routed experts read from disk (default: auto, only "
                        "when they do not fit in memory), as `strata serve --expert-cache`")
    s.add_argument("--expert-cache-rule", metavar="RULE", help="lfu (default), lru, ema, ema:ALPHA")
    s.add_argument("--expert-cache-pin", metavar="TRACE",
                   help="a routing trace whose most used experts are pinned in the expert cache")
    a = p.parse_args(argv)
    try:
        serve(
            a.model,
            host=a.host,
            port=a.port,
            dtype=a.dtype,
            weights=a.weights,
            max_batch=a.max_batch,
            max_queue=a.max_queue,
            ctx_size=a.ctx_size,
            step_tokens=a.step_tokens,
            prefix_cache_mb=a.prefix_cache_mb,
            served_model_name=a.served_model_name,
            expert_cache=a.expert_cache,
            expert_cache_rule=a.expert_cache_rule,
            expert_cache_pin=a.expert_cache_pin,
        )
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

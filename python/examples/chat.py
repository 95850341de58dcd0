"""A conversation with a chat model: a user's message a line on stdin, each reply streamed as it comes.

    python3 python/examples/chat.py MODEL_DIR [--system TEXT] [--max-new-tokens 256] [--device auto]

The model's chat template turns the conversation into its text (generate() takes the list of messages, as
`twell run --chat` does), and reuse_cache=True keeps the KV cache of the turn before: each turn prefills
only what the cache does not hold (the new message, and what the template writes around it), not the
whole history. After each reply, a line on stderr says how many of the prompt's tokens were cached and how
long the first token took. Ctrl-D (the end of the input) ends the conversation.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import twell  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a HuggingFace Llama-style model directory with a chat template")
    ap.add_argument("--system", help="a system message first")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = ap.parse_args()
    messages = [{"role": "system", "content": args.system}] if args.system else []
    with twell.Model(args.model, device=args.device) as model:
        if sys.stdin.isatty():
            print("a conversation: type a message, then Enter; Ctrl-D ends it", file=sys.stderr)
        for line in sys.stdin:
            line = line.rstrip("\r\n")
            if not line:
                continue
            messages.append({"role": "user", "content": line})
            reply = model.generate(messages, max_new_tokens=args.max_new_tokens, reuse_cache=True,
                                   stream=lambda text: print(text, end="", flush=True))
            print(flush=True)
            messages.append({"role": "assistant", "content": reply})
            g = model.last_generation
            print(f"({len(g['tokens'])} tokens; {g['reused_tokens']} of the prompt's cached, the first new one in "
                  f"{g['prefill_seconds'] * 1e3:.1f} ms, then {g['tokens_per_second']:.1f} tokens/s)", file=sys.stderr)


if __name__ == "__main__":
    main()

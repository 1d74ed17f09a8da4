"""The long run: ``.venv/bin/python -m tests.differential.run --bodies 1000000`` prints the result table (Markdown)
and, for each kind of finding, its first examples. See tests/differential/README.md."""

from __future__ import annotations

import argparse
import asyncio
import sys

from tests.differential.harness import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential.run", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bodies", type=int, default=1_000_000, help="bodies in all, client bodies first")
    parser.add_argument("--forms", type=int, default=300, help="seeded forms each client writes")
    parser.add_argument("--batch", type=int, default=5000, help="bodies per batch (one Node process each)")
    parser.add_argument("--examples", type=int, default=3, help="examples shown per kind of finding")
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.seed, forms=args.forms, bodies=args.bodies, batch=args.batch, keep=args.examples))
    print(f"seed {args.seed}, {results.total('bodies')} bodies, {results.seconds:.0f} s\n")
    print(results.table())
    for kind, outcomes in sorted(results.examples.items()):
        print(f"\n## {kind}\n")
        for outcome in outcomes:
            print(outcome.describe())
    return 1 if results.total("safety") or results.total("helpfulness") else 0


if __name__ == "__main__":
    sys.exit(main())

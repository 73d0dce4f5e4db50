"""`python -m jobs.score`: classify texts, or score text pairs with a cross-encoder.

`--task classify` (the default) writes `label`, `probs` and `logits`; `--task score
--pair-column COL` writes a relevance `score` (sigmoid of a one-logit head) and `logits`.
"""

from __future__ import annotations

import sys

from jobs.cli import main

if __name__ == "__main__":
    sys.exit(main("jobs.score", __doc__.splitlines()[0], ("classify", "score"), sys.argv[1:], {"task": "classify"}))

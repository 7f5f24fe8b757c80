"""engines.gguf_file against the gguf package's own reader on the real SmolLM2 file: every metadata field,
every tensor's name, shape, type and bytes; and a damaged file is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from engines.errors import ModelError
from engines.gguf_file import GGUFFile


@pytest.mark.slow
def test_same_fields_and_tensors_as_the_gguf_package():
    import gguf

    from evalsuite.models import smollm2_path

    path = smollm2_path()
    ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
    header = {k for k in theirs.fields if k.startswith("GGUF.")}  # the package's header pseudo-fields
    assert set(ours.fields) == set(theirs.fields) - header and ours.version == theirs.fields["GGUF.version"].contents()
    for key, f in theirs.fields.items():
        if key in header:
            continue
        want = f.contents()
        got = ours.fields[key].contents()
        assert got == (want.tolist() if isinstance(want, np.ndarray) else want), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert tuple(a.shape) == tuple(int(x) for x in b.shape) and a.tensor_type == b.tensor_type, a.name
        assert a.data.shape == b.data.shape and a.data.tobytes() == b.data.tobytes(), a.name


def test_damaged_files_are_one_line(tmp_path):
    from engines.gguf_loader import read_gguf

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + (5).to_bytes(8, "little"))
    with pytest.raises(ModelError, match="corrupt GGUF file .*truncated"):
        read_gguf(bad)
    bad.write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(ModelError, match="bad magic"):
        read_gguf(bad)

"""The tar headers core/tar.py writes: a size over the ustar field goes to a pax header.

A whole layer's members: test_oci_layer.py.
"""

from __future__ import annotations

from sparkseal.core import tar


def test_a_size_over_the_ustar_field_goes_to_pax() -> None:
    size = 9 * 2**30
    header = tar._header(b"big.bin", b"0", 0o644, size)
    assert len(header) == 3 * 512  # pax header, its records, the ustar header
    assert b"size=%d\n" % size in header[512:1024]
    assert header[1024 + 124 : 1024 + 136] == b"00000000000\0"

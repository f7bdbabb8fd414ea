"""The top-bits lookup that stands in for ``torch.bucketize`` in the eager encode (``gradwise.state.bucket_lookup``):
the same counts as ``torch.bucketize`` for every code map's midpoints and levels, ties included."""
import pytest
import torch

from gradwise.state.bucket_lookup import BucketLookup
from gradwise.state.maps import LOOKUP_MIN, CodeMap, values_at

MAPS = [("dynamic", 8, True), ("dynamic", 8, False), ("dynamic", 4, True), ("dynamic", 4, False),
        ("linear", 8, False), ("linear", 4, False)]


def _probes(boundaries: torch.Tensor) -> torch.Tensor:
    """Floats where a count can change or a lookup could go wrong: both ends of every bucket of 65536 floats,
    every boundary and the floats either side of it, the infinities, and random floats of every magnitude (no
    NaN: the encode never looks one up)."""
    top = torch.arange(1 << 16, dtype=torch.int64)
    ends = torch.cat([(top << 16), (top << 16) | 0xFFFF]).to(torch.int32).view(torch.float32)
    generator = torch.Generator().manual_seed(0)
    random_bits = torch.randint(-(1 << 31), 1 << 31, (1 << 20,), dtype=torch.int64, generator=generator)
    spread = torch.rand(1 << 20, generator=generator) * 2 - 1
    probes = torch.cat([ends, random_bits.to(torch.int32).view(torch.float32), spread,
                        spread.sign() * 10 ** (torch.rand(1 << 20, generator=generator) * -9),
                        boundaries, boundaries.nextafter(torch.tensor(float("inf"))),
                        boundaries.nextafter(torch.tensor(float("-inf"))),
                        torch.tensor([0.0, -0.0, float("inf"), float("-inf")])])
    return probes[~probes.isnan()]


@pytest.mark.parametrize("right", [False, True], ids=["midpoints", "levels"])
@pytest.mark.parametrize("kind,bits,signed", MAPS, ids=lambda v: str(v))
def test_the_lookup_counts_as_bucketize_does(kind, bits, signed, right):
    boundaries = CodeMap(kind, bits, signed).table(torch.device("cpu"))[1 if right else 2]
    lookup = BucketLookup.build(boundaries, right)
    assert lookup is not None, "every code map's levels are a bfloat16 step apart or more"
    x = _probes(boundaries)
    expected = torch.bucketize(x, boundaries, right=right)
    counts = lookup(x)
    assert counts.dtype == expected.dtype == torch.int64
    mismatched = (counts != expected).nonzero().flatten()
    assert mismatched.numel() == 0, [(x[i].item(), counts[i].item(), expected[i].item()) for i in mismatched[:5]]


def test_code_maps_look_up_large_tensors_of_any_strides_and_bucketize_the_rest():
    code_map = CodeMap("dynamic", 8, True)
    midpoints = code_map.table(torch.device("cpu"))[2]
    generator = torch.Generator().manual_seed(1)
    large = (torch.rand(96, 64, generator=generator) * 2 - 1).t()  # not contiguous, LOOKUP_MIN elements or more
    assert large.numel() >= LOOKUP_MIN and not large.is_contiguous()
    assert torch.equal(code_map.nearest(large), torch.bucketize(large.contiguous(), midpoints))
    assert code_map.nearest(large).shape == (64, 96) and code_map._lookups[(large.device, False)] is not None
    small = large[:3, :5]  # fewer elements, and not float32: bucketized
    assert torch.equal(code_map.nearest(small), torch.bucketize(small.contiguous(), midpoints))
    as_double = large.double()
    assert torch.equal(code_map.nearest(as_double), torch.bucketize(as_double.contiguous(), midpoints.double()))


def test_two_boundaries_in_one_bucket_have_no_lookup_and_bucketize():
    close = torch.tensor([1.0, 1.0 + 2**-20, 2.0])  # the first two share a bucket (same top 16 bits)
    assert BucketLookup.build(close, right=False) is None
    assert BucketLookup.build(torch.tensor([1.0, 1.0 + 2**-7, 2.0]), right=False) is not None


@pytest.mark.parametrize("count", [7, LOOKUP_MIN, 3 * LOOKUP_MIN + 5])
def test_values_at_takes_what_indexing_takes(count):
    table = torch.rand(256, generator=torch.Generator().manual_seed(2))
    codes = torch.randint(0, 256, (count, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)).t()
    for index in (codes, codes.long()):
        taken = values_at(table, index)
        assert taken.shape == index.shape and torch.equal(taken, table[index.long()])

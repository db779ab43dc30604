"""NPHead under the released options reproduces what the authors' NP head computed on the same inputs
(``tests/golden/np_head_released.npz``, recorded by ``tests/golden/record_np_head_golden.py``; source and command
in ``np_head_released.json``).

Same weights (a deterministic pattern, checked by each parameter's sum |w|), same features, labels and injected
noise. Tolerance: float32 round-off, ``|ours - theirs| <= 1e-5 * max(1, max |theirs|)`` per quantity.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from golden_files import recorded, recorder
from npsemiseg.config import compose
from npsemiseg.heads import NPHead

RTOL_SCALE = 1e-5

pytestmark = pytest.mark.usefixtures("single_seeded_thread")



REC = recorder("np_head")
DATA = recorded("np_head_released")

#: the released options (switches np_attention, np_kl, np_zero_centers, np_sync_memories, np_push_every_pixel,
#: np_scrambled_memories, np_memories_persist, np_memory_zero_row, np_memory_stream, np_memory_label_size)
RELEASED = dict(attention="per_channel", kl="authors", mask_empty=False, sync_memories=False, enqueue_per_class=None,
                memory_rows="scrambled", persist_memories=False, memory_zero_row=True, enqueue_order="stream",
                memory_resolution="labels")


@pytest.mark.parametrize("framework", ["u2pl", "augseg"])
def test_the_released_protocol_sets_these_options(framework):
    """What the golden checks is what ``protocol: released`` runs: its NP cells' head options include every
    option above at the value used here."""
    cell = dict(framework=framework, dataset="pascal_classic", partition="92", head="np")
    released = compose("paper", **cell, protocol="released").config.head.options
    assert {k: released.get(k) for k in RELEASED} == RELEASED
    corrected = compose("paper", **cell, protocol="corrected").config.head.options
    assert all(corrected.get(k) != v for k, v in RELEASED.items())


def _ours(decoder_impl: str = "concat", **changes) -> NPHead:
    """Our head with the authors' weights: their parameters in their order map onto ours by role; their decoder's
    first conv reads ``[z, x, r]``, ours ``[x, z, r]``."""
    head = NPHead(REC.C, REC.K, latent_dim=REC.D, memory_size=REC.Q, training_samples=REC.T, lambda_kl=1.0,
                  decoder_impl=decoder_impl, hidden_channels=256, **{**RELEASED, **changes})
    theirs = {}
    for salt, name, shape in _official_shapes():
        theirs[name] = REC.pattern_weights(shape, salt)
        assert float(theirs[name].double().abs().sum()) == pytest.approx(float(DATA[f"weight_abs_sum/{name}"]), rel=1e-12)
    first = theirs["decoder.Conv_Decoder.0.weight"]
    d, c = REC.D, REC.C
    mapping = {
        "query_net.0": "memory_dim_transform.Conv_1.0", "query_net.3": "memory_dim_transform.Conv_1.3",
        "query_net.6": "memory_dim_transform.Conv_1.6", "latent_encoder.mlp.0": "mean_logvar_net.MLP.L0",
        "latent_encoder.mlp.2": "mean_logvar_net.MLP.L1", "decoder.conv1": "decoder.Conv_Decoder.0",
        "decoder.tail.2": "decoder.Conv_Decoder.3", "decoder.tail.5": "decoder.Conv_Decoder.6",
    }
    state = {}
    for ours, official in mapping.items():
        state[f"{ours}.weight"] = theirs[f"{official}.weight"]
        state[f"{ours}.bias"] = theirs[f"{official}.bias"]
    state["decoder.conv1.weight"] = torch.cat([first[:, d : d + c], first[:, :d], first[:, d + c :]], dim=1)
    missing = head.load_state_dict(state, strict=False).missing_keys
    assert all(key.endswith(("_memory", "_pointer", "_count", "_centers")) for key in missing)
    return head


def _official_shapes():
    """(salt, name, shape) of the authors' parameters in their module order (as the recorder salts them)."""
    c, d, k = REC.C, REC.D, REC.K
    shapes = [
        ("memory_dim_transform.Conv_1.0.weight", (d, c, 1, 1)), ("memory_dim_transform.Conv_1.0.bias", (d,)),
        ("memory_dim_transform.Conv_1.3.weight", (d, d, 1, 1)), ("memory_dim_transform.Conv_1.3.bias", (d,)),
        ("memory_dim_transform.Conv_1.6.weight", (d, d, 1, 1)), ("memory_dim_transform.Conv_1.6.bias", (d,)),
        ("mean_logvar_net.MLP.L0.weight", (d, d)), ("mean_logvar_net.MLP.L0.bias", (d,)),
        ("mean_logvar_net.MLP.L1.weight", (2 * d, d)), ("mean_logvar_net.MLP.L1.bias", (2 * d,)),
        ("decoder.Conv_Decoder.0.weight", (256, 2 * d + c, 3, 3)), ("decoder.Conv_Decoder.0.bias", (256,)),
        ("decoder.Conv_Decoder.3.weight", (256, 256, 3, 3)), ("decoder.Conv_Decoder.3.bias", (256,)),
        ("decoder.Conv_Decoder.6.weight", (k, 256, 1, 1)), ("decoder.Conv_Decoder.6.bias", (k,)),
    ]
    assert {f"weight_abs_sum/{name}" for name, _ in shapes} == {key for key in DATA if key.startswith("weight_abs_sum/")}
    return [(salt, name, shape) for salt, (name, shape) in enumerate(shapes)]


class _Noise:
    """``NPHead.sample`` with the recorded eps ``[T, B, D]`` instead of ``randn``."""

    def __init__(self, monkeypatch):
        self.eps = None
        monkeypatch.setattr(NPHead, "sample", staticmethod(lambda mean, sigma, t: mean + sigma * self.eps))


def _close(name: str, ours: torch.Tensor, theirs: np.ndarray, deviations: dict[str, float]) -> None:
    ours_np = ours.detach().double().numpy()
    assert ours_np.shape == theirs.shape, name
    diff = float(np.abs(ours_np - theirs).max())
    deviations[name] = diff
    assert diff <= RTOL_SCALE * max(1.0, float(np.abs(theirs).max())), f"{name}: max |difference| {diff:.3g}"


@pytest.mark.parametrize("decoder_impl", ["concat", "split"])
@pytest.mark.parametrize("variant", ["released", "persist"])
def test_np_head_reproduces_the_authors_centers_latent_kl_and_logits(variant, decoder_impl, monkeypatch):
    """Two training steps and an inference; ``released`` starts every step from the zero-row memories, ``persist``
    carries them over (``persist_memories=True``, as the authors' lists without DDP). Both decoders: ``concat``
    (the reference) and ``split`` (the default; its training and inference kernels)."""
    noise = _Noise(monkeypatch)
    head = _ours(decoder_impl, persist_memories=variant == "persist").train()
    latent: dict[str, torch.Tensor] = {}
    original = head.latent_encoder.forward
    head.latent_encoder.forward = lambda a: latent.setdefault(f"{len(latent)}", original(a))
    deviations: dict[str, float] = {}
    for step in (1, 2):
        latent.clear()
        prefix = f"{variant}/step{step}"
        features = torch.from_numpy(DATA[f"step{step}_features"])
        labels = torch.from_numpy(DATA[f"step{step}_labels"])
        noise.eps = torch.from_numpy(DATA[f"step{step}_eps"])
        out = head(features, labels=labels, context_features=features[: REC.M], context_labels=labels[: REC.M])
        assert head.target_count.tolist() == DATA[f"{prefix}/target_rows"].tolist()
        assert head.context_count.tolist() == DATA[f"{prefix}/context_rows"].tolist()
        _close(f"{prefix}/target_centers", head.target_centers, DATA[f"{prefix}/target_centers"], deviations)
        _close(f"{prefix}/context_centers", head.context_centers, DATA[f"{prefix}/context_centers"], deviations)
        (mean_t, sigma_t), (mean_c, sigma_c) = latent["0"], latent["1"]
        for name, value in (("mean_t", mean_t), ("sigma_t", sigma_t), ("mean_c", mean_c), ("sigma_c", sigma_c)):
            _close(f"{prefix}/{name}", value, DATA[f"{prefix}/{name}"], deviations)
        _close(f"{prefix}/kl", head.kl_divergence(mean_t, sigma_t, mean_c, sigma_c), DATA[f"{prefix}/kl"], deviations)
        _close(f"{prefix}/kl_mean", torch.as_tensor(out.stats["kl"]), DATA[f"{prefix}/kl"].mean(), deviations)
        _close(f"{prefix}/aux_loss", out.aux_loss, DATA[f"{prefix}/kl"].mean(), deviations)  # lambda_kl = 1
        _close(f"{prefix}/logits", out.logits, DATA[f"{prefix}/logits"], deviations)
    noise.eps = torch.from_numpy(DATA["infer_eps"])
    head.eval()
    with torch.no_grad():
        logits = head(torch.from_numpy(DATA["step2_features"])).logits
    _close(f"{variant}/infer/logits", logits, DATA[f"{variant}/infer/logits"], deviations)
    print(json.dumps({k: f"{v:.2e}" for k, v in deviations.items()}))


def test_the_golden_distinguishes_each_released_memory_option(monkeypatch):
    """Each memory option of the released code changes the recorded step-1 centers beyond the tolerance: the
    golden would catch a head that lost any of them."""
    noise = _Noise(monkeypatch)
    features, labels = torch.from_numpy(DATA["step1_features"]), torch.from_numpy(DATA["step1_labels"])
    noise.eps = torch.from_numpy(DATA["step1_eps"])
    expected = DATA["released/step1/target_centers"]
    for change in (dict(memory_zero_row=False), dict(enqueue_order="random"), dict(memory_resolution="features"),
                   dict(memory_rows="pixel")):
        head = _ours(**change).train()
        head(features, labels=labels, context_features=features[:1], context_labels=labels[:1])
        assert float(np.abs(head.target_centers.double().numpy() - expected).max()) > 1e-3, change

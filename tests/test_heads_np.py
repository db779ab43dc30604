"""NPHead as the paper describes it, with the released code's behaviours as options: attention, memories,
latent, decoder, inference."""

from __future__ import annotations

import pytest
import torch
from benchmark_scripts import load_benchmark
from head_fixtures import C, D, K, LargestOutput, batch, small_np, train_step
from torch.utils._python_dispatch import TorchDispatchMode

from npsemiseg.heads import IGNORE_INDEX, NPDecoder, NPHead, NPLatent, attention_aggregate
from npsemiseg.heads.np_kernels import attention_aggregates, norm_relu_conv

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


# ---- attention ------------------------------------------------------------------------------


def reference_attention(query, centers, filled, kind):
    """Direct Eq. 8 with the full [B, K, D, h, w] tensor."""
    q = query[:, None]  # [B, 1, D, h, w]
    c = centers[None, :, :, None, None]  # [1, K, D, 1, 1]
    mask = ~filled[None, :, None, None, None]
    if kind == "per_channel":
        score = -(q - c).pow(2)  # [B, K, D, h, w]
    else:
        dist2 = (q - c).pow(2).sum(dim=2, keepdim=True)  # [B, K, 1, h, w]
        score = -dist2 if kind == "squared" else -dist2.sqrt()
    if kind == "mean":
        score = torch.zeros_like(score)
    weights = score.masked_fill(mask, float("-inf")).softmax(dim=1)
    return (weights * c).sum(dim=1).mean(dim=(2, 3))


@pytest.mark.parametrize("kind", ["euclidean", "squared", "per_channel", "mean"])
def test_attention_matches_direct_computation_with_masking(kind):
    query = torch.randn(2, D, 3, 5, dtype=torch.float64)
    centers = torch.randn(K, D, dtype=torch.float64)
    filled = torch.tensor([True, False, True, True])
    got = attention_aggregate(query, centers, filled, kind, channel_chunk=3)
    assert got.dtype == torch.float32
    expected = reference_attention(query, centers, filled, kind).float()
    assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("kind", ["euclidean", "squared", "per_channel"])
def test_attention_gradient_matches_direct_computation(kind):
    query = torch.randn(2, D, 3, 4, requires_grad=True)
    centers = torch.randn(K, D)
    filled = torch.tensor([True, True, False, True])
    weights = torch.randn(2, D)
    (grad,) = torch.autograd.grad((attention_aggregate(query, centers, filled, kind, channel_chunk=3) * weights).sum(), query)
    (expected,) = torch.autograd.grad((reference_attention(query, centers, filled, kind) * weights).sum(), query)
    assert torch.allclose(grad, expected, atol=1e-5)


@pytest.mark.parametrize("kind", ["euclidean", "squared", "per_channel", "mean"])
def test_attention_over_several_memories_at_once_equals_one_memory_at_a_time_with_gradients(kind):
    """The head attends its target and context centers in one call: values and the query's gradient as two calls."""
    query = torch.randn(2, D, 3, 5, dtype=torch.float64, requires_grad=True)
    centers = [torch.randn(K, D, dtype=torch.float64), torch.randn(K, D, dtype=torch.float64)]
    filled = [torch.tensor([True, False, True, True]), torch.tensor([True, True, True, False])]
    together = attention_aggregates(query, centers, filled, kind, channel_chunk=3)
    apart = [attention_aggregate(query, c, f, kind, channel_chunk=3) for c, f in zip(centers, filled)]
    weights = torch.randn(2, D)
    for got, expected in zip(together, apart):
        assert got.shape == (2, D) and torch.allclose(got, expected, atol=1e-6)
    if kind != "mean":  # (no gradient reaches the query through uniform weights)
        (grad,) = torch.autograd.grad(sum((a * weights).sum() for a in together), query)
        (expected,) = torch.autograd.grad(sum((a * weights).sum() for a in apart), query)
        assert torch.allclose(grad, expected, atol=1e-6)


def test_empty_class_gets_no_weight_even_when_nearest():
    query = torch.randn(1, D, 2, 2)
    centers = torch.randn(K, D)
    centers[1] = query[0, :, 0, 0]  # the empty class sits exactly on a query pixel
    filled = torch.tensor([True, False, True, True])
    got = attention_aggregate(query, centers, filled)
    keep = [0, 2, 3]
    expected = attention_aggregate(query, centers[keep], torch.ones(3, dtype=torch.bool))
    assert torch.allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("kind, bound_channels", [("euclidean", 1), ("squared", 1), ("per_channel", 2)])
def test_attention_never_builds_b_k_d_h_w(kind, bound_channels):
    b, d, h, w = 2, 8, 6, 6
    query = torch.randn(b, d, h, w, requires_grad=True)
    with LargestOutput() as mode:
        out = attention_aggregate(query, torch.randn(K, d), torch.ones(K, dtype=torch.bool), kind, channel_chunk=2)
        out.sum().backward()
    assert mode.largest <= max(b * K * bound_channels * h * w, b * d * h * w) < b * K * d * h * w


# ---- memories -------------------------------------------------------------------------------


def identifiable_rows(b: int, h: int, w: int) -> torch.Tensor:
    """``[b, D, h, w]`` whose pixel (i, j) of image n holds (n, i, j, n*100 + i*10 + j): unique per pixel."""
    n, i, j = torch.meshgrid(torch.arange(b), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([n, i, j, n * 100 + i * 10 + j], dim=1).float()


def test_memory_rows_are_pixel_feature_vectors_and_ignore_never_enters():
    head = small_np(memory_size=64, enqueue_per_class=64)
    b, h, w = 2, 4, 5
    rows = identifiable_rows(b, h, w)
    labels = torch.randint(0, K - 1, (b, h, w))  # class K-1 never present
    labels[:, 1] = IGNORE_INDEX
    head.enqueue("target", rows, labels)
    for k in range(K):
        count = int(head.target_count[k])
        pixels = rows.permute(0, 2, 3, 1)[labels == k]  # [n_k, D] pixel vectors of class k
        assert count == len(pixels)  # every class pixel entered (fewer than the bound), ignore did not
        stored = head.target_memory[k, :count]
        assert torch.equal(stored[torch.argsort(stored[:, 3])], pixels[torch.argsort(pixels[:, 3])])
        assert torch.all(head.target_memory[k, count:] == 0)
        if count:
            assert torch.allclose(head.target_centers[k], pixels.mean(0))
    assert int(head.target_count[K - 1]) == 0 and torch.all(head.target_centers[K - 1] == 0)
    assert not any(int(i) == 1 for i in head.target_memory[:, :, 1][head.target_memory[:, :, 3] > 0])


def test_forward_memory_holds_the_query_vectors_of_the_labelled_pixels():
    head = small_np(memory_size=128, enqueue_per_class=128)
    features, labels = batch(b=2, h=4, w=4, scale=2)
    train_step(head, features, labels)
    query = head.query(features).permute(0, 2, 3, 1)  # [B, h, w, D]
    small = labels[:, ::2, ::2]  # nearest downsampling
    for k in range(K):
        pixels = query[small == k]
        stored = head.target_memory[k, : int(head.target_count[k])]
        assert stored.shape == pixels.shape
        # each stored row equals one pixel's vector of that class
        assert torch.cdist(stored, pixels).min(dim=1).values.max() < 1e-5
        context = head.context_memory[k, : int(head.context_count[k])]
        assert context.shape[0] == int((small[:1] == k).sum())  # context = the labelled slice only


def test_enqueue_is_bounded_per_class_and_random():
    head = small_np(memory_size=16, enqueue_per_class=3)
    rows = identifiable_rows(1, 6, 6)
    labels = torch.zeros(1, 6, 6, dtype=torch.long)
    labels[0, :, :2] = 1  # class 1: 12 pixels, class 0: 24 pixels, classes 2 and 3: none
    head.enqueue("target", rows, labels)
    assert head.target_count.tolist() == [3, 3, 0, 0] and head.target_pointer.tolist() == [3, 3, 0, 0]
    first = head.target_memory[0, :3, 3].clone()
    picks = {tuple(first.tolist())}
    for _ in range(5):
        other = small_np(memory_size=16, enqueue_per_class=3)
        other.enqueue("target", rows, labels)
        picks.add(tuple(other.target_memory[0, :3, 3].tolist()))
        assert set(other.target_memory[1, :3, 2].tolist()) <= {0.0, 1.0}  # class 1 lives in columns 0-1
    assert len(picks) > 1  # a random subset, not always the same pixels


def test_fifo_pointer_wraps():
    head = small_np(memory_size=10, enqueue_per_class=4)
    labels = torch.zeros(1, 2, 2, dtype=torch.long)  # exactly 4 pixels of class 0 per step
    for step in (1, 2, 3):
        head.enqueue("target", torch.full((1, D, 2, 2), float(step)), labels)
    assert int(head.target_pointer[0]) == 2 and int(head.target_count[0]) == 10
    assert head.target_memory[0, :, 0].tolist() == [3, 3, 1, 1, 2, 2, 2, 2, 3, 3]
    assert torch.allclose(head.target_centers[0], torch.full((D,), 2.2))


def test_context_slice_reuse_equals_a_separate_context_pass():
    features, labels = batch()
    heads = [small_np(), small_np()]
    heads[1].load_state_dict(heads[0].state_dict())
    for head, context in zip(heads, (features[:1], features[:1].clone())):
        torch.manual_seed(3)
        train_step_out = head.train()(features, labels=labels, context_features=context, context_labels=labels[:1])
        assert train_step_out.logits.shape[0] == 3
    assert torch.equal(heads[0].context_memory, heads[1].context_memory)


def test_memories_are_written_only_in_train_mode():
    head, features, labels = small_np(), *batch()
    train_step(head, features, labels)
    before = {k: v.clone() for k, v in head.state_dict().items() if "memory" in k or "count" in k}
    head.eval()
    out = head(features, labels=labels, context_features=features[:1], context_labels=labels[:1])
    assert out.aux_loss.item() > 0  # labels given in eval: KL computed, memories untouched
    assert all(torch.equal(v, head.state_dict()[k]) for k, v in before.items())


# ---- latent path, KL, gradients -------------------------------------------------------------


def test_latent_samples_and_kl():
    head = small_np(training_samples=4)
    features, labels = batch()
    train_step(head, features, labels)
    query = head.query(features)
    target = attention_aggregate(query, head.target_centers, head.target_count > 0)
    context = attention_aggregate(query, head.context_centers, head.context_count > 0)
    mean_t, sigma_t = head.latent_encoder(target)
    mean_c, sigma_c = head.latent_encoder(context)
    assert torch.all(sigma_t >= 0.1)
    torch.manual_seed(5)
    latent = head.eval().infer_latent(features)
    torch.manual_seed(5)
    eps = torch.randn(4, 2, D)
    assert torch.allclose(latent.z, mean_t + sigma_t * eps, atol=1e-6)
    assert torch.allclose(latent.r, context, atol=1e-6)
    out = head(features, labels=labels)  # eval, no context: stored context centers
    from npsemiseg.heads import gaussian_kl

    assert out.stats["kl"] == pytest.approx(gaussian_kl(mean_t, sigma_t, mean_c, sigma_c).mean().item(), rel=1e-4)


def test_detach_query_blocks_the_backbone_gradient_of_the_query_path():
    for detach, expect_gradient in ((True, False), (False, True)):
        head = small_np(detach_query=detach)
        features, labels = batch()
        features.requires_grad_(True)
        out = train_step(head, features, labels)
        out.aux_loss.backward()  # the KL reaches the features only through the query path
        has_gradient = features.grad is not None and features.grad.abs().sum() > 0
        assert has_gradient == expect_gradient
        assert head.query_net[0].weight.grad.abs().sum() > 0


def test_mean_aggregator_ignores_the_query_and_mask_empty_false_uses_zero_centers():
    head = small_np(attention="mean")
    head.target_centers.copy_(torch.randn(K, D))
    head.target_count.copy_(torch.tensor([1, 1, 0, 1]))
    a = attention_aggregate(torch.randn(2, D, 3, 3), head.target_centers, head.filled("target"), "mean")
    assert torch.allclose(a, head.target_centers[[0, 1, 3]].mean(0).expand(2, -1))
    authors = small_np(mask_empty=False)
    authors.target_count.copy_(torch.tensor([1, 1, 0, 1]))
    assert authors.filled("target").all() and not head.filled("target").all()


# ---- decoder --------------------------------------------------------------------------------


@pytest.mark.parametrize("size, norm", [((1, 1), "instance"), ((2, 3), "instance"), ((5, 7), "instance"),
                                        ((5, 7), "group"), ((5, 7), "batch")])
def test_split_decoder_equals_concat_including_border(size, norm):
    decoder = NPDecoder(C, D, K, hidden_channels=32, norm=norm)
    x = torch.randn(2, C, *size, requires_grad=True)
    z, r = torch.randn(3, 2, D, requires_grad=True), torch.randn(2, D)
    split = decoder(x, z, r)
    grads_split = torch.autograd.grad(split.square().sum(), [x, z])
    decoder.impl = "concat"
    concat = decoder(x, z, r)
    grads_concat = torch.autograd.grad(concat.square().sum(), [x, z])
    assert split.shape == (3, 2, K, *size)
    rel = (split - concat).abs().max() / concat.abs().max()
    assert rel < 1e-4
    border = torch.ones(size, dtype=torch.bool)
    border[1:-1, 1:-1] = False
    assert (split - concat)[..., border].abs().max() / concat.abs().max() < 1e-4
    for a, b in zip(grads_split, grads_concat):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max().clamp_min(1.0)))


def test_split_first_conv_matches_concat_exactly_in_float64():
    decoder = NPDecoder(C, D, K, hidden_channels=8).double()
    x, z, r = (torch.randn(2, C, 4, 6, dtype=torch.float64), torch.randn(3, 2, D, dtype=torch.float64),
               torch.randn(2, D, dtype=torch.float64))
    split = decoder.first_conv(x, z, r)
    decoder.impl = "concat"
    assert torch.allclose(split, decoder.first_conv(x, z, r), atol=1e-12)


@pytest.mark.parametrize("samples_per_conv, keep_first_stage", [(None, False), (1, False), (2, False), (3, False),
                                                                (None, True), (3, True)])
def test_fused_decoder_tail_equals_plain_layers_with_gradients(samples_per_conv, keep_first_stage):
    """Whatever the samples per convolution call (T = 3: 3, 2 + 1 or 1 call per stage); the gradients of every
    parameter and input (the first stage's maps are recomputed in backward from the shared ``conv_x``)."""
    decoder = NPDecoder(C, D, K, hidden_channels=8).double()
    decoder.samples_per_conv, decoder.keep_first_stage = samples_per_conv, keep_first_stage
    x, z, r = (
        torch.randn(2, C, 4, 5, dtype=torch.float64, requires_grad=True),
        torch.randn(3, 2, D, dtype=torch.float64, requires_grad=True),
        torch.randn(2, D, dtype=torch.float64, requires_grad=True),
    )
    params = [*decoder.parameters(), x, z, r]
    fused = decoder(x, z, r)
    g_fused = torch.autograd.grad(fused.sin().sum(), params)
    plain = decoder.tail(decoder.first_conv(x, z, r)).view(3, 2, K, 4, 5)
    g_plain = torch.autograd.grad(plain.sin().sum(), params)
    assert torch.allclose(fused, plain, atol=1e-10)
    with torch.no_grad():  # the in-place inference path
        assert torch.allclose(decoder(x, z, r), plain, atol=1e-10)
    for a, b in zip(g_fused, g_plain):
        assert torch.allclose(a, b, atol=1e-10)


@pytest.mark.parametrize("samples_per_conv", [None, 3])
def test_decoder_keeps_one_t_by_b_map_per_sample_for_backward_not_two(samples_per_conv):
    """Autograd keeps the second stage's normalised maps only: the first stage's are recomputed from ``conv_x``."""
    decoder = NPDecoder(C, D, K, hidden_channels=8)
    decoder.samples_per_conv = samples_per_conv
    x, z, r = torch.randn(2, C, 6, 7, requires_grad=True), torch.randn(3, 2, D), torch.randn(2, D)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        decoder(x, z, r).sum().backward()
    per_stage = 3 * 2 * 8 * 6 * 7  # T x B maps of the hidden width
    assert saved.count(per_stage) == 1 and max(saved) == per_stage
    assert sum(saved) < 1.5 * per_stage + x.numel() + sum(p.numel() for p in decoder.parameters())
    decoder.keep_first_stage, saved[:] = True, []  # the other side of the trade
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        decoder(x, z, r).sum().backward()
    assert saved.count(per_stage) == 2


def test_decoder_convolves_all_samples_at_once_on_cuda_and_one_at_a_time_on_cpu():
    decoder = NPDecoder(C, D, K, hidden_channels=8)
    assert decoder.sample_groups(5, torch.device("cuda")) == 1 and decoder.sample_groups(5, torch.device("cpu")) == 5
    decoder.samples_per_conv = 2
    assert decoder.sample_groups(5, torch.device("cuda")) == 3 and decoder.sample_groups(1, torch.device("cpu")) == 1


@pytest.mark.parametrize("samples_per_conv", [None, 2, 3])
@pytest.mark.parametrize("size", [(3, 3), (2, 7), (1, 5), (9, 4)])
def test_inference_decoder_matches_the_plain_layers_at_every_map_size_and_offset(size, samples_per_conv):
    """The inference path (InstanceNorm statistics of the first conv from its border terms, a group of
    samples per convolution call) equals the plain layers in float64, and stays accurate in float32 when the
    maps carry a large offset and the latent terms are large (cancellation in the variance would show)."""
    decoder = NPDecoder(C, D, K, hidden_channels=8).double()
    decoder.samples_per_conv = samples_per_conv
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, C, *size, generator=g, dtype=torch.float64) * 0.5 + 20.0
    z, r = torch.randn(3, 2, D, generator=g, dtype=torch.float64) * 30, torch.randn(2, D, generator=g, dtype=torch.float64)
    plain = decoder.tail(decoder.first_conv(x, z, r)).view(3, 2, K, *size)
    with torch.no_grad():
        assert torch.allclose(decoder(x, z, r), plain, atol=1e-9)
        fast32 = decoder.float()(x.float(), z.float(), r.float()).double()
    assert ((fast32 - plain).abs().max() / plain.abs().max()) < 1e-4


def test_np_head_split_and_concat_give_the_same_logits_for_the_same_noise():
    split, features, labels = small_np(), *batch(h=6, w=6)
    train_step(split, features, labels)
    concat = small_np(decoder_impl="concat")
    concat.load_state_dict(split.state_dict())
    outs = []
    for head in (split.eval(), concat.eval()):
        torch.manual_seed(11)
        outs.append(head(features).logits)
    assert (outs[0] - outs[1]).abs().max() / outs[1].abs().max() < 1e-4


# ---- inference ------------------------------------------------------------------------------


def test_state_dict_round_trip_gives_identical_inference_logits():
    head, features, labels = small_np(), *batch()
    for _ in range(3):
        train_step(head, features, labels)
    state = head.state_dict()
    assert {"target_memory", "context_memory", "target_centers", "context_centers", "target_pointer", "context_count"} <= set(
        state
    )
    fresh = small_np()
    fresh.load_state_dict(state)
    logits = []
    for model in (head.eval(), fresh.eval()):
        torch.manual_seed(7)
        logits.append(model(features).logits)
    assert torch.equal(logits[0], logits[1])


def test_inference_uses_only_the_centers():
    head, features, labels = small_np(), *batch()
    train_step(head, features, labels)
    head.eval()
    torch.manual_seed(1)
    expected = head(features).logits
    head.target_memory.normal_()  # scramble the memories: centers alone must drive inference
    head.context_memory.normal_()
    torch.manual_seed(1)
    assert torch.equal(head(features).logits, expected)


def test_forward_with_a_given_latent_equals_inference():
    head, features, labels = small_np(), *batch()
    train_step(head, features, labels)
    head.eval()
    torch.manual_seed(2)
    latent = head.infer_latent(features, num_samples=2)
    assert isinstance(latent, NPLatent) and latent.z.shape == (2, 2, D) and latent.r.shape == (2, D)
    torch.manual_seed(2)
    expected = head(features, num_samples=2).logits
    assert torch.allclose(head(features, latent=latent).logits, expected, atol=1e-6)
    # a window of the image decoded with the whole image's latent
    window = head(features[..., :3, :4].contiguous(), latent=latent).logits
    assert window.shape == (2, 2, K, 3, 4)
    with pytest.raises(ValueError, match="latent"):
        head(features[:1], latent=latent)
    with pytest.raises(ValueError, match="latent"):
        head(features, labels=labels, latent=latent)


def test_spread_diagnostic_border_exceeds_interior():
    head = small_np()
    features, labels = batch(b=2, h=16, w=16)
    train_step(head, features, labels)
    stats = head.eval()(features).stats
    assert stats["spread_border"] > stats["spread_interior"] >= 0.0
    assert stats["target_classes"] == K


class ConvolutionDtypes(TorchDispatchMode):
    """Records the dtypes of the tensor arguments of every convolution and convolution backward."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.convolution, torch.ops.aten.convolution_backward):
            self.calls.append((str(func.overloadpacket), tuple(a.dtype for a in args if isinstance(a, torch.Tensor))))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kernel_size", [1, 3])
def test_norm_relu_conv_of_a_float32_map_under_bf16_autocast_keeps_one_dtype_per_convolution(kernel_size):
    """A float32 ``y`` (as the float32 InstanceNorm statistics of the first decoder conv can give) under
    bf16 autocast: the convolution runs in bf16, and its backward gets bf16 gradient, input and weight
    alike (the old kernel passed a bf16 gradient with a float32 weight, which cuDNN refuses)."""
    conv = torch.nn.Conv2d(6, 4, kernel_size, padding=kernel_size // 2)
    y = torch.randn(2, 6, 5, 7) * 3 + 1
    expected = conv(torch.relu(torch.nn.functional.instance_norm(y)))
    y_low = y.clone().requires_grad_()
    with ConvolutionDtypes() as mode:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = norm_relu_conv(y_low.clone(), conv, chunks=2)
        out.float().sin().sum().backward()
    assert out.dtype == torch.bfloat16
    assert [name for name, _ in mode.calls].count("aten.convolution_backward") == 4  # 2 chunks x (input, weight)
    mixed = [(name, dtypes) for name, dtypes in mode.calls if len(set(dtypes)) > 1]
    assert not mixed, mixed
    assert (out.float() - expected).abs().max() < 0.05 * expected.abs().max()
    grads_low = [y_low.grad, *(p.grad.clone() for p in conv.parameters())]
    conv.zero_grad()
    y_ref = y.clone().requires_grad_()
    conv(torch.relu(torch.nn.functional.instance_norm(y_ref))).sin().sum().backward()
    for low, ref in zip(grads_low, [y_ref.grad, *(p.grad for p in conv.parameters())]):
        assert low.dtype == ref.dtype == torch.float32
        assert (low - ref).norm() <= 0.05 * ref.norm()


def test_a_float64_head_trains_and_infers_in_float64():
    """A float64 head (the whole-step goldens run float64 networks) takes the float32 attention's aggregates into
    its float64 latent encoder: logits and gradients in float64, the attention alone in float32."""
    head, (features, labels) = small_np().double(), batch()
    features = features.double().requires_grad_(True)
    out = train_step(head, features, labels)
    out.logits.mean().backward()
    assert out.logits.dtype == features.grad.dtype == torch.float64
    assert head.eval()(features.detach()).logits.dtype == torch.float64


def test_bf16_autocast_runs_and_stays_close_to_float32():
    """Under bf16 autocast every convolution, forward and backward, gets tensors of one dtype (cuDNN
    refuses a bf16 gradient with a float32 weight; the CPU kernels let it pass), and the gradients
    stay close to float32's."""
    head, features, labels = small_np(), *batch()
    torch.manual_seed(3)
    train_step(head, features, labels).logits.float().mean().backward()
    reference_grads = [p.grad.clone() for p in head.parameters() if p.grad is not None]
    head.zero_grad()
    torch.manual_seed(3)
    with ConvolutionDtypes() as mode:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = train_step(head, features, labels)
        out.logits.float().mean().backward()
    assert torch.isfinite(out.logits.float()).all()
    assert any(name.endswith("convolution_backward") for name, _ in mode.calls)
    mixed = [(name, dtypes) for name, dtypes in mode.calls if len(set(dtypes)) > 1]
    assert not mixed, mixed
    grads = [p.grad for p in head.parameters() if p.grad is not None]
    assert len(grads) == len(reference_grads)
    low_flat, flat = torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in reference_grads])
    assert (low_flat - flat).norm() <= 0.1 * flat.norm()
    head.eval()
    torch.manual_seed(4)
    reference = head(features).logits
    torch.manual_seed(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = head(features).logits
    assert low.dtype == torch.bfloat16  # the decoder's convs ran under autocast (its float32 statistics did not leak)
    assert (low.float() - reference).abs().max() < 0.03 * reference.abs().max()


# ---- the authors' memory bugs as options (np_scrambled_memories, np_memories_persist, np_memory_zero_row,
# np_memory_stream, np_memory_label_size; tests/test_np_head_golden.py checks them against the authors' head) ----


def _coded_rows(b: int, h: int, w: int) -> torch.Tensor:
    """``[b, D, h, w]`` whose value names its place: image * 10000 + channel * 100 + raster index."""
    return (torch.arange(b)[:, None, None, None] * 10000.0 + torch.arange(D)[None, :, None, None] * 100.0
            + torch.arange(h * w, dtype=torch.float).view(1, 1, h, w))


def test_stream_order_keeps_the_last_pixels_in_masked_select_order():
    """``enqueue_order="stream"``, pixel rows: class k's memory takes the last P of its pixels, image by image
    in raster order; an ignored pixel never enters; a class with fewer pixels keeps all of them."""
    rows = _coded_rows(2, 3, 3)
    labels = torch.zeros(2, 3, 3, dtype=torch.long)
    labels[1, 2, 2] = IGNORE_INDEX
    labels[0, 0, 1] = labels[1, 0, 0] = 1
    head = small_np(enqueue_order="stream", enqueue_per_class=4)
    head.enqueue("target", rows, labels)
    assert head.target_count[:2].tolist() == [4, 2]
    stored = head.target_memory[0, :4]
    assert (stored % 100).tolist() == [[float(i)] * D for i in (4, 5, 6, 7)]  # image 1, raster 4..7 (8 ignored)
    assert (torch.div(stored, 10000, rounding_mode="floor") == 1).all()
    assert (torch.div(stored % 10000, 100, rounding_mode="floor") == torch.arange(D)).all()
    assert head.target_memory[1, :2, 0].tolist() == [1.0, 10000.0]  # image 0 before image 1


def test_stream_scrambled_rows_run_channel_major_per_image():
    """With scrambled rows the stream is read channel by channel within each image: image b's n pixels give n
    rows, row i holding the values D i .. D i + D - 1 of its channel-major run; the last P rows are kept."""
    b, h, w = 2, 4, 4
    rows = _coded_rows(b, h, w)
    labels = torch.zeros(b, h, w, dtype=torch.long)
    head = small_np(enqueue_order="stream", memory_rows="scrambled", enqueue_per_class=16, memory_size=16)
    head.enqueue("target", rows, labels)
    n = h * w
    expected = torch.stack([torch.tensor([10000.0 + ((D * i + j) // n) * 100 + (D * i + j) % n for j in range(D)])
                            for i in range(n)])  # image 1's 16 rows: the newest 16 of 32
    assert torch.equal(head.target_memory[0], expected)


def test_zero_row_counts_in_the_mean_until_q_rows_arrive():
    """``memory_zero_row=True``: every memory starts with one zero row (count 1), so a center of n < Q rows is
    n / (n + 1) of their mean; Q new rows push it out."""
    rows = torch.ones(1, D, 2, 2)
    labels = torch.tensor([[[0, 0], [1, IGNORE_INDEX]]])
    head = small_np(memory_zero_row=True, enqueue_per_class=None, memory_size=3)
    assert head.target_count.tolist() == [1] * K
    head.enqueue("target", rows, labels)
    assert head.target_count.tolist()[:3] == [3, 2, 1]
    assert torch.allclose(head.target_centers[:3, 0], torch.tensor([2 / 3, 1 / 2, 0.0]))
    head.enqueue("target", rows, labels)  # 2 more rows of class 0: past Q, the zero row is gone
    assert head.target_centers[0, 0] == 1.0 and head.target_count[0] == 3
    head.reset_memories()
    assert head.target_count.tolist() == [1] * K and head.target_pointer.tolist() == [1] * K


def test_label_size_memories_run_the_small_convnet_on_upsampled_features():
    """``memory_resolution="labels"``: the memories hold the small ConvNet's rows on the features upsampled to
    the label size (every labelled pixel), not the queries with downsampled labels."""
    torch.manual_seed(0)
    features, labels = batch(b=1, h=3, w=3, scale=3)
    labels[:] = 0
    head = small_np(memory_resolution="labels", enqueue_per_class=None, memory_size=128)
    train_step(head, features, labels)
    up = torch.nn.functional.interpolate(features, size=(9, 9), mode="bilinear", align_corners=True)
    with torch.no_grad():
        expected = head.query_net(up)[0].flatten(1).mean(dim=1)
    assert head.target_count[0] == 81
    assert torch.allclose(head.target_centers[0], expected, atol=1e-6)
    with pytest.raises(ValueError, match="memory_resolution"):
        small_np(memory_resolution="input")
    with pytest.raises(ValueError, match="enqueue_order"):
        small_np(enqueue_order="last")


def test_scrambled_memory_rows_hold_one_channel_of_many_pixels():
    """``memory_rows="scrambled"``: a row is D consecutive values of one channel (the authors'
    ``masked_select(...).view(-1, D)``); ``"pixel"``: a row is one pixel's feature vector."""
    h = w = 4  # 16 pixels of class 0, a multiple of D: every scrambled row stays inside one channel
    rows = torch.arange(D)[None, :, None, None] * 100.0 + torch.arange(h * w, dtype=torch.float).view(1, 1, h, w)
    labels = torch.zeros(1, h, w, dtype=torch.long)
    for kind in ("pixel", "scrambled"):
        head = small_np(memory_rows=kind, enqueue_per_class=None)
        head.enqueue("target", rows, labels)
        stored = head.target_memory[0, : int(head.target_count[0])]
        channels = torch.div(stored, 100, rounding_mode="floor")
        assert stored.shape[0] == h * w
        if kind == "pixel":
            assert (channels == torch.arange(D)).all()
        else:
            assert (channels == channels[:, :1]).all() and len(channels[:, 0].unique()) == D
    with pytest.raises(ValueError, match="memory_rows"):
        small_np(memory_rows="rows")


def test_memories_that_never_persist_give_zero_centers_at_inference():
    """``persist_memories=False``: each training step starts from empty memories, and inference uses
    all-zero centers for every class (the authors' banks never leave DDP's forward)."""
    torch.manual_seed(0)
    features, labels = batch()
    head = small_np(persist_memories=False)
    train_step(head, features, labels)
    first = head.target_count.clone()
    train_step(head, features[1:], labels[1:])
    assert (head.target_count <= first).all()  # not accumulated: the memory holds only the last step
    head.eval()
    torch.manual_seed(1)
    out = head(features).logits
    reference = small_np(persist_memories=True, mask_empty=False)
    reference.load_state_dict(head.state_dict())
    for name in ("target_centers", "context_centers"):
        getattr(reference, name).zero_()
    reference.target_count.fill_(1)
    reference.context_count.fill_(1)
    reference.eval()
    torch.manual_seed(1)
    assert torch.equal(out, reference(features).logits)
    # an empty head infers (zero centers) instead of refusing
    small_np(persist_memories=False).eval()(features)


@pytest.mark.parametrize("memory_size, expected", [(64, 64), (255, 255), (256, 256), (2560, 256)])
def test_enqueue_default_follows_memory_size(memory_size, expected):
    """The default ``enqueue_per_class`` is min(256, Q): a small memory never trips over a value the caller never set."""
    head = NPHead(8, 3, memory_size=memory_size)
    assert head.enqueue_per_class == expected
    NPHead.check_options({"memory_size": memory_size})  # the config path accepts it too


def test_enqueue_explicit_contradiction_is_an_error():
    """Only a value the caller gave above Q is refused, naming both numbers; None means up to Q."""
    with pytest.raises(ValueError, match=r"enqueue_per_class: expected at most memory_size=64, got 256"):
        NPHead(8, 3, memory_size=64, enqueue_per_class=256)
    with pytest.raises(ValueError, match="enqueue_per_class: expected a positive int, got 'some'"):
        NPHead(8, 3, memory_size=64, enqueue_per_class="some")
    assert NPHead(8, 3, memory_size=64, enqueue_per_class=None).enqueue_per_class == 64
    assert NPHead(8, 3, memory_size=64, enqueue_per_class="auto").enqueue_per_class == 64


def test_np_head_reads_back_one_value_in_training_and_none_in_inference():
    """Each read of a device value makes the host wait for the GPU: a training-mode forward reads the label check
    only (the context labels are a slice of the checked labels), an inference forward nothing once the memories
    are known to hold rows; a loaded state is checked again, once."""
    host_work = load_benchmark("host_work")
    head, (features, labels) = small_np(), batch(h=6, w=6)
    train_step(head, features, labels)
    with host_work.HostWork() as work:
        out = train_step(head, features, labels)
    assert work.reads == 1 and "check_label_values" in next(iter(work.read_sites))
    assert set(out.stats) >= {"kl", "target_classes", "spread_border"}
    head.eval()
    with host_work.HostWork() as work:
        head(features)
    assert work.reads == 0
    head.load_state_dict(head.state_dict())
    reads = []
    for _ in range(2):
        with host_work.HostWork() as work:
            head(features)
        reads.append(work.reads)
    assert reads == [1, 0]
    empty = small_np().eval()
    with pytest.raises(ValueError, match="target memory is empty"):
        empty(features)



def test_np_head_operator_calls_per_step_stay_few():
    """At a small batch a GPU step is bound by the host's operator calls (``docs/performance.md``, "NP-SemiSeg's
    operator calls"): a training forward + backward of this small head (T = 3) and an inference forward stay
    within the counts of the fused kernels (one matrix product for the constant maps' border, one for the taps'
    gradient, the attention in 24 calls): 750 / 651 training calls (CPU / CUDA decoder path), 243 / 171 in
    inference. Before them 847 / 737 and 278 / 204: the per-tap products of before fail here."""
    host_work = load_benchmark("host_work")
    head, (features, labels) = small_np(), batch(h=6, w=6)
    counts = {}
    for per_conv in (None, 3):  # the CPU path (a sample per convolution) and the CUDA path (all T at once)
        head.decoder.samples_per_conv = per_conv
        for _ in range(2):  # the first builds the cached constants
            with host_work.HostWork() as work:
                out = train_step(head, features.requires_grad_(), labels)
                (out.logits.sum() + out.aux_loss).backward()
            head.eval()
            with torch.no_grad(), host_work.HostWork() as inference:
                head(features)
        counts[per_conv] = (work.ops, inference.ops)
    assert counts[None][0] <= 770 and counts[3][0] <= 670, counts
    assert counts[None][1] <= 250 and counts[3][1] <= 180, counts

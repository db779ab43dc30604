"""Whole official training runs on the mini-study's data, beside the project's cell with the same settings.

For each seed, four runs of 960 iterations on the study dataset (``jobs/specs/mini.yaml``'s data, network and
schedule; data seed ``--data-seed``, partition 1/16):

- **official**: the official training script (``--framework``'s, :data:`OFFICIAL`) run end to end, its ``main()``
  imported from the checkout under ``--official-root`` (``<owner>+<repo>`` or ``<repo>`` folders, as
  ``official_side_by_side.py``; nothing of it is copied into the project): its data pipeline (``SemiDataset``:
  resize, crop and its padding, flip, the strong views, CutMix boxes), samplers, loss, optimiser, poly schedule,
  per-epoch evaluation and best-checkpoint report. It reads the study data exported in its layout
  (:func:`export_official_layout`: JPEG images, PNG labels, the official list files). What a CPU run needs is
  patched, and nothing else: every patch is a monkeypatch listed in :data:`PATCHES`, printed with the result and
  written into it. The network is the project's (:class:`OfficialInterface`), built with the project's initial
  weights of the seed, the pretrained backbone included, behind the official model's interface.
- **project**: the project's cell with the same settings (:func:`project_config`: protocol ``released``, the mini
  study's overrides, the official pipeline's resize and blur, epochs of the official length, an evaluation per
  epoch and the best one reported, as the official script does).
- **supervised**, both ways: UniMatch's ``supervised.py`` on the same network and data pipeline (the labeled list
  repeated to the unlabeled pool's length, as ``unimatch.py`` repeats it, so that an epoch has the same iterations),
  and the project's ``supervised`` cell with the same settings.

Output ``--out/official_runs.json``: ``{"framework", "data_seed", "runs": [{"seed", "official_miou", "project_miou",
"official_curve", "project_curve", ...}], "supervised": [{"seed", "official_miou", "project_miou", ...}], "patches",
...}``, mIoU x 100 on the validation split (the best of the per-epoch evaluations, as both report; the last one
beside it). :func:`equivalence` is the two one-sided tests of official against project.

    python benchmarks/official_runs.py --official-root ROOT --framework unimatch --data-seed 7919 --seeds 0 1 --out DIR
    # the sides of a seed in parallel processes, then joined, and the curves drawn (with the supervised reference's):
    python benchmarks/official_runs.py ... --framework unimatch --seeds 0 --no-supervised --side official --out A
    python benchmarks/official_runs.py ... --framework unimatch --seeds 0 --no-supervised --side project --out B
    python benchmarks/official_runs.py ... --framework supervised --seeds 0 --out C
    python benchmarks/official_runs.py --combine A/official_runs.json B/official_runs.json C/official_runs.json --out D
    python benchmarks/official_runs.py --figure curves.png --combine D/official_runs.json   # also curves.jsonl
    # a regime (a change of the study's scale: does the official code put UniMatch >= FixMatch > supervised there?),
    # both sides changed alike and evaluated on the tune split, where settings are chosen:
    python benchmarks/official_runs.py ... --framework unimatch --split tune \
        --set data.options.image_size=96 --set schedule.crop_size=96 --out E

A 960-iteration side took 15-23 min (supervised) and about an hour (UniMatch) on a 2-core VM at load 17-38, and
9.4-11.6 min (UniMatch, one thread) at load 4-8 (``docs/learning.md``, "Whole runs: official vs project").
Supervised is UniMatch's ``supervised.py`` (the network and pipeline of ``unimatch.py``: AugSeg's decoder variant) for
the frameworks on that network (FixMatch, UniMatch, AugSeg, PS-MT), and U2PL's ``train_sup.py`` (``--framework
supervised_u2pl``, :func:`official_u2pl_sup_run`) for those on U2PL's network (U2PL and MT-CPS: the U2PL decoder; MT-CPS's
released network is the same without its train-time dropout) (:data:`SUPERVISED`; ``--no-supervised`` leaves it out).
``train_sup.py``'s ``main()`` runs as ``train_semi.py``'s (:func:`run_official_u2pl`) with its suponly VOC 1464 config
(:func:`u2pl_sup_cfg`): its ``build_vocloader`` takes the labeled list as it is, so an epoch is ``n_l / B`` iterations (8
in the mini study), each validated (120 evaluations in 960 iterations); the project's side is its ``supervised`` cell on
U2PL's network and pipeline with epochs of the labeled images, each evaluated; patches :data:`U2PL_SUP_PATCHES`
(``train_semi.py``'s but the memory banks).

U2PL (``--framework u2pl``: Haochen-Wang409/U2PL's ``train_semi.py``, :func:`run_official_u2pl`): its ``main()``
with its ``get_loader`` (``voc_dset`` on the export in U2PL's layout, :data:`LAYOUTS`: list files of ids under a
``pascal`` folder, labels in ``SegmentationClassAug``; ``n_sup`` set so that both sets are drawn to the unlabeled
pool's size, as on VOC, so an epoch is ``N_u / B`` iterations), its transforms (``rand_resize`` [0.5, 2]: bilinear
without antialiasing, the label's legacy nearest, the size floored, the project's side alike since 2026-11-29 (switch
``u2pl_resize``); flip, ``rand`` crop padding the image with 0 and the label with 0, no blur; validation
``center`` crop of the crop size: the whole 64 px image), ``DistributedSampler``, ``Criterion``, CutMix,
unsupervised and contrastive losses, memory bank, EMA teacher, poly LR, per-epoch ``validate`` (student before
``sup_only_epoch``, teacher after) and the best.
Its config (:func:`u2pl_cfg`) is ``experiments/pascal/1464/ours/config.yaml`` of the checkout (drop_percent,
thresholds, ranks, temperature, queries, negatives, loss weights 1) with the cell's crop, batches, LR, weight
decay, EMA decay, epochs and ``sup_only_epoch``. The project's side takes the same (:func:`project_config`): the
official pipeline (:data:`OFFICIAL_PIPELINES`), and the mini study's time rule (``npsemiseg.short_run``, the rule
of ``jobs/specs/mini.yaml``'s ``cell_overrides``) applied to epochs of the official length: EMA decay 0.9 and
queues of 356 / 593 keys as in the mini study (they scale with steps and pixels), ``sup_only_epochs`` 1 (one
epoch of 120 iterations; the mini study's 2 are of 8 iterations). What differs from U2PL's own run, and why
(:data:`U2PL_PATCHES`): the network is the project's U2PL network of the cell (its decoder is 16 / 8 channels
wide, its heads 64, its representation 16; U2PL's decoder hard-codes 256, so it cannot hold it) behind
``ModelBuilder``'s interface (:class:`U2PLInterface`); ``main`` hard-codes memory banks 256 wide and queues of
30000 / 50000, replaced by the representation's width and the cell's queues; no aux head (the mini study has
none); data loading in the main process (``workers: 0``, as the project's cell).

AugSeg (``--framework augseg``: ZhenZHAO/AugSeg's ``train_semi.py``, :func:`run_official_augseg`) the same way: its
``main(args)`` on the same layout, with its transforms (the long side a random integer in [0.5, 2] x the base size,
the image's 64 here as VOC's 500, flip, a random crop padded at the bottom and right with the mean and 255, its
strong views with their blur sigma in [0.1, 2]), adaptive CutMix, thresholded unsupervised loss, EMA of parameters
and buffers, poly LR and per-epoch validation of the whole image, the teacher's best reported; its config
``exps/zrun_vocs/r50_voc_semi662/config_semi.yaml`` (VOC 1/16) with the cell's data, crop, batch, LR, weight decay,
EMA decay (0.927167: the mini study's, by the same rule), threshold, unsupervised weight and epochs; only the teacher
evaluated (``evaluate_student: False``, the project's side alike). Its patches (:data:`AUGSEG_PATCHES`): the CPU
ones, the network (the project's AugSeg network behind ``ModelBuilder``, :class:`AugSegInterface`), a discarding
tensorboard, ``skimage`` stand-ins, the iterator's ``next()`` and NumPy 1's ``uint8`` cast in its strong views' hue
operation (:class:`Numpy1Uint8`). The project's side: its ``augseg`` cell under
``released`` with UniMatch's pipeline settings (:data:`OFFICIAL_PIPELINES`: AugSeg's resize, padding placement and
blur are UniMatch's; its crop pads the image with the ImageNet mean where UniMatch's pads it with black).

UniMatch V2 (``--framework unimatch_v2``, ``fixmatch_v2``, ``supervised_v2``: LiheYoung/UniMatch-V2's
``unimatch_v2.py``, ``fixmatch.py``, ``supervised.py``, :func:`official_v2_run`) on the mini study's ViT
(``jobs/specs/mini_vit.yaml``: ``vit_mini`` + the DPT at 16 features, ``pretrained:vit_mini``, crop 56, AdamW at 5e-5
with the head at x40, batch 8 + 8, 960 iterations): each ``main()`` on the export in UniMatch's layout (V2's
``SemiDataset`` reads V1's; the same transforms: resize of the long side in [0.5, 2] x, crop padded with 0 and 255
(254 -> ignored in the unlabeled views), flip, colour jitter, grey, blur sigma in [0.1, 2], CutMix boxes), its
samplers, losses, EMA teacher (ratio ``min(1 - 1 / (iters + 1), 0.996)``, parameters and buffers), poly LR set after
the step and two evaluations per epoch (the model, then the EMA: ``evaluate(..., multiplier=14)``, the whole image
resized to multiples of 14 and back). Reported: the EMA's best (``official_miou``, ``official_curve``: what the
project's cell evaluates and what the published numbers are), the model's beside it (``official_student_miou``,
``official_student_curve``); ``supervised.py``'s model. Patches (:data:`V2_PATCHES`): the CPU ones, ``DPT`` by
:class:`DPTInterface` (the project's network of the cell, its complementary dropout the project's
``complementary_pass``), ``torch.load`` of ``./pretrained/<backbone>.pth`` answered with the project's backbone state
dict of the seed, the loaders in the process (``num_workers`` 0 for the scripts' 4), a discarding tensorboard, the
class names, the evaluations recorded. Settings (:func:`v2_cfg`, :func:`v2_settings`): the official EMA decay 0.996
on the project's side too (``mini_vit.yaml`` scales it to 0.9; nothing in the official loop is patched for it), the
official pipeline as for UniMatch (:data:`OFFICIAL_PIPELINE`). What differs from the mini study's cells, and why:
the pipeline (as for every framework here) and the EMA decay (the official's). The crop's image padding is black on
both sides (switch ``crop_fill``, deviation D18; the ImageNet mean on the project's side before 2026-11-29).
``supervised_v2`` is not ``mini_vit.yaml``'s ``supervised_unimatch_v2`` but the official ``supervised.py`` both ways:
the DPT's 1x1 class projection as head (not U2PL's block), the LR after the step, the batch doubled to 16
(``supervised.py`` doubles ``cfg['batch_size']``; the official config gets 8), and epochs of 240 iterations (the script draws
``n_upsampled[cfg['dataset']]`` items an epoch from a four-dataset table: it runs under the name ``pascal``, whose 3000
is the smallest, the labeled list repeated to 3840, a multiple of the 960 unlabeled images; the project's side
evaluates every 60 labeled epochs of 4 iterations): four evaluations in 960 iterations, not eight.

PS-MT (``--framework psmt``: yyliu01/PS-MT's ``VocCode/main.py``, :func:`run_official_psmt`): ``main(-1, 1, config,
args)``, what its ``__main__`` calls with one GPU (no DDP: ``DataParallel`` without devices runs the module in the
process; no process group), with its config dict (:func:`psmt_cfg`: ``configs/config_deeplab_v3+.json`` of the
checkout with ``main.py``'s arguments and the cell's settings) on the export in its layout (:data:`LAYOUTS` ``psmt``:
``VOCdevkit/VOC2012`` with ``<n>_train_supervised.txt`` lists under ``VocCode/DataLoader/voc_splits``): its ``VOC``
loaders and transforms (the long side a random integer in [0.5, 2] x ``base_size``, 600 / 500 of the image as on VOC:
77 px; a 64 px crop padded at the bottom and right with the mean and 255; flip; the strong view's jitter, grey and
blur), the labeled loader cycled, the warm-up of the three networks (``_warm_up``), then per epoch the alternating core
teacher, the assist mask, CutMix, ``EntireModel.forward`` (the student's two passes with the T-VAT decoder,
``semi_ce_loss``, the cosine ``ConsistencyWeight``), SGD, ``Poly``, the EMA of the core teacher's state and the
whole-image validation of both teachers' mean logits; the best of the per-epoch mIoU reported (PS-MT logs each and
names its checkpoints by it). The network: the project's PS-MT networks of the cell (the ``psmt`` decoder; the
student with the pretrained backbone, the teachers with their own initialisation and scratch backbones, as the
released cell builds them) behind ``EntireModel``, split as the PS-MT golden recorder splits them (``Encoder`` and
``Upsample`` of :mod:`official.psmt_network`, which the recorder imports: :func:`psmt_entire_model`).
Patches (:data:`PSMT_PATCHES`): ``.cuda()``, the network, VOC's 21 classes where the code hard-codes them (the
dataset's ``num_classes``, ``semi_ce_loss``'s one-hot: the logits padded with classes of softmax 0; the assist
teacher's top 7 of K < 7 classes: all), the EMA keep rate at its call site, ``np.int``, the wandb board and its
imports (wandb, seaborn: not installed), the evaluation recorded.
Settings: the mini study's time rule for epochs of the official length: EMA keep rate 0.9, ramp-up 1.2 epochs, and
the released warm-up of 5 epochs scaled alike to one: 120 iterations, in PS-MT's units 15 passes of its labeled
loader (8 iterations) for each network, then ``epochs`` 7 (:func:`psmt_warm_up_epochs`, :func:`official_epochs`).
What differs from the project's side, and why (the official code's, not patched): the student's LR is the base LR in
the warm-up and ``Poly`` runs over the 7 semi-supervised epochs (the project's poly runs over all 960 steps); the
warm-up passes the three networks through their own labeled batches (the project's share one); ``cycle`` replays
the first pass's labeled batches, augmentations included, every epoch; ``main`` seeds ``random`` and torch with 42
whatever the seed (the official seeds differ in the initial weights and NumPy's CutMix draws only); its resize is
bicubic; the official side evaluates the 7 semi-supervised epochs, the project's the warm-up epoch too. Supervised
reference: UniMatch's ``supervised.py``, as for the others (not the mini study's ``supervised_psmt``).

MT-CPS (``--framework mt_cps``: charlesCXK/TorchSemiSeg's ``exp.voc/voc8.res50v3+.MeanTeacher``,
:func:`official_mt_cps_run`; the checkout: ``git clone`` of it, then ``git checkout 5e0c29c``, in a folder whose path
holds ``TorchSemiSeg``, where config.py finds ``furnace``): its ``train.py``, a script without ``main``, imported (so
run) in its folder with config.py's ``config`` updated by :func:`mt_cps_cfg` (the export in its layout,
:data:`LAYOUTS` ``torchsemiseg``: images and labels under ``train_aug/image``, ``train_aug/label`` and ``val/...``,
lists ``subset_train_aug/train_aug_labeled_1-16 .txt``, ``..._unlabeled_...`` and ``val.txt``; the cell's crop, batch,
LR, EMA decay, MSE weight and epochs; epochs of ``N_u / B`` by config.py's own formula): its ``Engine`` (distributed,
one rank), ``VOC`` loaders and ``TrainPre`` (flip, a scale of six, normalisation, a crop padded with 0 and 255),
``DistributedSampler``, the labeled and the unlabeled call of ``Network`` (the EMA inside the first), MSE between
softmaxes x ``unsup_weight`` (no ramp-up: train.py has none), ``group_weight`` SGD at ``WarmUpPolyLR`` (no warm-up)
and the checkpoints of the epochs after the first half; then ``eval.py`` run as its ``__main__`` with ``-e <first>-``
(script.sh's ``-e 20-34`` of 34 epochs scaled to the run: epochs 5-7 of 8,
:func:`official.study.mt_cps_evaluated_from`) and ``-d 0``: its sliding evaluation (one window: the crop is the whole
image) of the student; the best reported, the evaluated epochs' curve beside it. The project's side: the mini study's
``mt`` cell under ``released`` (framework ``mt_cps``), selecting among the same epochs
(``evaluation.select_from_epoch`` 6, counted from 1) with the EMA decay of the mini study's rule (0.9). Patches
(:data:`MT_CPS_PATCHES`): the CPU ones, apex (DDP a pass-through, SyncBatchNorm BatchNorm2d), the Engine's distributed
set-up (one-rank gloo), an ``easydict`` stand-in where not installed, the network (the project's student and teacher
behind ``SingleNetwork``'s interface in the official ``Network``:
:func:`official.mt_cps_network.mean_teacher_network`, which the MT-CPS golden recorder imports), ``init_weight`` (it
would re-initialise the project's decoder and head), ``next()``, ``collections.Iterable``, eval.py's device handling,
and eval.py's process-wide changes undone. What differs, the official code's: its scale is one of six values (the
project's pipeline draws U[0.5, 2]); train.py seeds torch with the rank (0) whatever the seed, the official seeds
differing in the initial weights and ``random``'s augmentation draws only; the unlabeled sampler is never given the
epoch (the same order every epoch).

The NP-SemiSeg authors' U2PL and AugSeg (``--framework np_u2pl``, ``np_augseg``: Jianf-Wang/NP-SemiSeg's
``U2PL/train_semi.py`` and ``AugSeg/train_semi.py``, U2PL's and AugSeg's scripts with the NP head:
:func:`official_np_u2pl_run`, :func:`official_np_augseg_run`) run as U2PL's and AugSeg's above (the same functions, on
the checkout's ``U2PL`` and ``AugSeg`` folders, their configs ``experiments/pascal/1323/np`` and
``exps/zrun_vocs/r50_voc_semi732`` with the cell's settings), beside the project's ``u2pl`` and ``augseg`` cells with
the NP head under ``released`` (the mini study's NP widths: latent 2, heads 64 channels; memory 2560, T = 5).
Patches (:data:`NP_U2PL_PATCHES`, :data:`NP_AUGSEG_PATCHES`): the plain script's, but the network: the project's
network of the cell with the authors' ``NP_HEAD`` (imported from the checkout) holding the project's NP head weights
of the seed, mapped as the NP golden recorders map it (:mod:`official.np_network`, which they import), written out as
the authors' ``ModelBuilder.forward`` (:class:`NPInterface`); ``NP_HEAD``'s 256-wide decoder at the cell's width, the
memories' initial rows at the cell's latent width (``main`` hard-codes 32), the forward's list arguments copied as the
authors' torch 1.10 DDP copied them (their memories never persist: deviation N2) and DDP's ``device_ids`` read as
``[0]`` by ``main``. What both evaluate: U2PL's the student in the supervised-only epoch, the teacher after; AugSeg's
the teacher; each image's prediction from T = 5 latent samples drawn around the zero centers (the project's side
evaluates T = 5 too, not ``released``'s 20 of ``eval.py``). One difference remains, the project's: the authors take
the argmax of the mean of the T logits, the project's evaluation that of the mean of the T softmaxes (negligible at
the mini study's latent width: ``docs/learning.md``).

The modules: :mod:`official.study` (the settings, the export, the official epoch, the project's side),
:mod:`official.patching` (a CPU run of an official script in this process, UniMatch's runner),
:mod:`official.networks` (the project's networks behind the official interfaces), :mod:`official.psmt_network`
(PS-MT's split of them), :mod:`official.np_network` (the project's NP head behind the NP-SemiSeg authors'
``NP_HEAD``), :mod:`official.voc_semi` (what U2PL and AugSeg share), one module per official code base
(:mod:`official.unimatch`, :mod:`official.v2`, :mod:`official.u2pl`, :mod:`official.augseg`, :mod:`official.psmt`,
:mod:`official.mt_cps`: its patches, config and run; :mod:`official.mt_cps_network`, the MeanTeacher's ``Network`` of
the project's networks), :mod:`official.report` (the verdict, records, curves and joined reports) and
:mod:`official.cli` (the command line, ``benchmarks/official_runs.py``'s). The framework modules import the shared
ones, never each other. :mod:`official.lockstep` (``benchmarks/official_lockstep.py``) records the NP-SemiSeg
authors' U2PL run of :mod:`official.u2pl` iteration by iteration and runs the project's step from each recorded state
on the same batch and draws; :mod:`official.draws` (``benchmarks/official_draws.py``) draws a whole run's data both
ways without training and compares the distributions (and trains the project's side in the authors' order);
:mod:`official.np_evaluation` (``benchmarks/official_np_evaluation.py``) evaluates an official checkpoint by the
authors' ``validate`` and by the project's evaluation path.
"""

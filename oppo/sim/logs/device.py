"""The device of a run whose log does not name its GPU (a setup's ``gpu = "unknown"``), read back from the log.

verl logs the MFU of the actor update (``perf/mfu/actor``; older logs ``mfu/actor``), which its FSDP worker's
``update_actor`` (``verl/workers/fsdp_workers.py``) computes as

    mfu = F x ppo_epochs / (t x n_gpus x P)

F: the FLOPs verl's flops counter (``verl/utils/flops_counter.py``, dense decoders: Llama, Qwen2, Qwen3) counts for
one forward and backward pass over the step's sequences (:func:`verl_update_flops`); t: the update's seconds;
n_gpus: the actor's GPUs; P: the peak verl promises for the device, from its own table by device name (989e12 for
H100 / H800 / H200, 312e12 for A100 / A800, 1336e12 for MI300X, ...). So the peak verl assumed reads back as

    P = F x ppo_epochs / (mfu x t x n_gpus)    [FLOP/s]

with t the logged ``timing_s/update_actor``. That is the trainer's timer around the worker call, a little longer
than the worker's own timer of the update that the MFU divides by (it adds moving the batch to the workers), so P
reads back a little low: 0.4% below verl's 312e12 on the bundled GPG run, 0.5% below 1336e12 on the MI300X run. F
takes the logged ``perf/total_num_tokens`` and the sequences' lengths as the replay draws them
(:func:`oppo.sim.logs.fit.step_lengths`: verl sums seqlen² over the real sequences, which the log does not list;
attention is 1-2% of F at these lengths).

The peak and the framework layer's fitted ``efficiency`` of each stage are one product: the peak fixes the scale,
the fit the rest. Bandwidth, link and network card are priors: the catalog GPU of the closest peak
(:func:`prior_gpu`), but for a link the log's passes show far slower (:func:`read_back_link`); the memory is at
least the most the log reserved (``perf/max_memory_reserved_gb``). Where the peak is the entry of verl's table for
catalog GPUs (:data:`VERL_PEAKS`) and the prior is one of them, the device is of that family and takes its fitted
fractions of the datasheet (``efficiency_of``: an A800 read back at the A100's 312 TFLOP/s is priced as an A100 is,
so a layer fitted on runs of named GPUs transfers to it); else the default fractions (``cost = "analytic"``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from oppo.catalog.gpus import GPU, GPUS
from oppo.records.metrics import device_count
from oppo.sim.cost.engine import ModelShape, model_shape
from oppo.sim.cost.framework import micro_batches
from oppo.sim.cost.gpu import gpu_efficiencies
from oppo.sim.logs.fit import fitted_count, step_lengths
from oppo.sim.logs.read import LoggedStep, TrainingLog
from oppo.sim.setup.presets import UNKNOWN_GPU, GpuSpec, Setup, first_gpu

# The peaks verl's flops counter promises by device name (verl/utils/flops_counter.py: get_device_flops in mid-2025,
# _DEVICE_FLOPS in 2026) -> the catalog GPUs of those names (none: a device the catalog does not have). A peak read
# back within READ_BACK of exactly one entry is that entry, so the device is one of its GPUs and takes their fitted
# efficiencies; a peak near a catalog GPU's by chance says nothing of its silicon, and one near two entries (H20's
# 148 and A40's 149.7; Ascend 910B's 354 and L40S's 362.05) is told apart by the memory the log reserved, or not at
# all.
VERL_PEAKS = {
    2500e12: (),  # GB200
    2250e12: ("b200",),
    1336e12: ("mi300x",),
    989e12: ("h100", "h800", "h200", "gh200"),
    362.05e12: ("l40s",),
    354e12: (),  # Ascend 910B
    312e12: ("a100", "a800", "a100-40gb"),
    181.05e12: (),  # L40
    149.7e12: ("a40",),
    148e12: ("h20",),
    119.5e12: ("l20",),
}
# read-back / promised: the logged update seconds include the batch's move to the workers, which verl's own timer
# of the update leaves out, so a peak reads back 0-5% low (0.4-0.5% on the shared runs)
READ_BACK = (0.95, 1.005)


def verl_update_flops(shape: ModelShape, tokens: float, seqlens: np.ndarray) -> float:
    """FLOPs verl's flops counter counts for one forward + backward pass over sequences of ``seqlens`` tokens
    (``tokens`` in all): 6 per weight per token (every layer's, the embedding's and the LM head's, tied or not: 3 x
    our forward FLOPs per token) and 12 x seqlen² x heads x head width x layers per sequence (attention)."""
    dense = 3 * shape.flops_per_token * tokens
    attention = 12 * float(np.sum(np.square(seqlens, dtype=float))) * shape.heads * shape.head_dim * shape.layers
    return dense + attention


def read_back_peak(setup: Setup, log: TrainingLog) -> tuple[float, int]:
    """The peak FLOP/s verl assumed for the run's device, median over the steps that log the MFU, the update's
    seconds and the token count; and the number of those steps. The setup gives the model, the sequences per step
    (batch x group size), the PPO epochs and the actor's GPUs, as the run had them."""
    steps = [s for s in log.steps if s.mfu and s.total_tokens and s.stages.get("update_actor")]
    if not steps:
        raise ValueError(
            f'{log.source}: gpu = "{UNKNOWN_GPU}" reads the device\'s peak back from perf/mfu/actor, '
            "timing_s/update_actor and perf/total_num_tokens, and no step of this log has all three: name the GPU "
            '(gpu = "h100", ...) or give the setup a [gpu_spec] table'
        )
    shape, n_gpus = model_shape(setup.actor), device_count(setup.devices["actor"])
    n_seqs = setup.batch * setup.group_size
    peaks = [  # per trainer step (a fully async trainer's row sums several, its MFU is their mean)
        verl_update_flops(shape, s.total_tokens / s.trainer_steps, _seqlens(s, n_seqs, setup.max_new_tokens))
        * setup.ppo_epochs
        / (s.mfu * s.stages["update_actor"] / s.trainer_steps * n_gpus)
        for s in steps
    ]
    return float(np.median(peaks)), len(steps)


def _seqlens(step: LoggedStep, n: int, cap: int) -> np.ndarray:
    """Prompt + response tokens of each of a step's ``n`` sequences: the logged mean prompt (where not logged, what
    the token count leaves beside the mean response) and the responses as the replay draws them."""
    per_step = step.total_tokens / step.trainer_steps
    prompt = step.prompt_mean if step.prompt_mean is not None else per_step / n - step.response_mean
    return prompt + step_lengths(step, n, cap)


def logged_memory_bytes(log: TrainingLog) -> float:
    """The most GPU memory a step reserved (bytes; 0 where the log does not say)."""
    return max((s.memory_reserved_bytes or 0.0 for s in log.steps), default=0.0)


def prior_gpu(peak_flops: float, memory_bytes: float) -> GPU:
    """The catalog GPU whose peak is closest to ``peak_flops`` (by ratio); of equal peaks (H100, H200 and GH200 all
    promise 989 TFLOP/s), the one with the least memory that holds ``memory_bytes`` (a log that reserved 70 GB is
    priced as the H100, the family's commonest part, not with an H200's bandwidth), else the one with the most. A
    log that reserved nothing it shows (``memory_bytes`` 0) takes the part verl's table entry names first (the A100
    80GB, the H100), not the least memory of all (an A100 40GB's bandwidth for a log that is silent). The CPU
    stand-in of the executor is no candidate."""
    family = verl_family(peak_flops) if memory_bytes <= 0 else ()
    if family:
        return GPUS[family[0]]
    gpus = [g for g in GPUS.values() if g.name != "cpu-core"]

    def key(g: GPU) -> tuple:
        holds = g.memory_bytes >= memory_bytes
        return abs(math.log(g.peak_flops / peak_flops)), not holds, g.memory_bytes if holds else -g.memory_bytes

    return min(gpus, key=key)


def resolve_gpu(setup: Setup, log: TrainingLog, fit_frac: float = 1.0) -> Setup:
    """``setup`` with its device read back from ``log`` where it has ``gpu = "unknown"`` and no ``[gpu_spec]``
    (else as it is): the peak verl assumed (:func:`read_back_peak`), the memory of the prior GPU or the most the log
    reserved, whichever is more, the prior's bandwidth and links (:func:`prior_gpu`) but a link far slower than the
    log's first ``fit_frac`` of steps show (:func:`read_back_link`), and the prior's fitted efficiencies where its
    peak is the one read back (else ``cost = "analytic"``)."""
    if setup.gpu != UNKNOWN_GPU or setup.gpu_spec is not None:
        return setup
    peak, n_steps = read_back_peak(setup, log)
    reserved = logged_memory_bytes(log)
    prior = prior_gpu(peak, reserved)
    source = (
        f"peak_flops read back from {log.source}'s perf/mfu/actor (verl's flops counter, median of {n_steps} steps): "
        f"the peak verl's own table gives the device's name, which its MFU divides by, not a measurement of the "
        f"device; memory_bytes the larger of the {prior.name}'s and the log's peak reserved; the other figures "
        f"priors: the catalog's {prior.name} (closest peak)"
    )
    if reserved > prior.memory_bytes:  # the table's name for the device and the memory it reserved disagree
        source += (
            f"; a contradiction: the log reserved {reserved / 1e9:.1f} GB, more than the {prior.name}'s "
            f"{prior.memory_bytes / 1e9:.0f} GB, so the device is not one, whatever verl's table called it"
        )
    same = prior.name in verl_family(peak, reserved) and prior.name in gpu_efficiencies()
    cost = setup.cost if same or setup.cost != "fitted" else "analytic"
    fitted = cost == "fitted"  # the prior's fitted efficiencies, where the setup takes fitted ones
    source += f"; the {prior.name}'s fitted efficiencies (verl's peak for it)" if fitted else "; default efficiencies"
    figures = {f.name: getattr(prior, f.name) for f in dataclasses.fields(GPU)}
    name = f"{UNKNOWN_GPU}-{peak / 1e12:.0f}tflops"
    figures |= {"name": name, "peak_flops": peak, "memory_bytes": max(prior.memory_bytes, reserved)}
    fitted_steps = list(log.steps[: fitted_count(len(log.steps), fit_frac)])
    link = read_back_link(setup, fitted_steps, prior.link_bytes_per_s)
    if link is not None:  # for this backend's passes alone (GpuSpec.link_read_from)
        figures |= {"link_bytes_per_s": link, "link_read_from": setup.framework.train_backend}
        figures["prior_link_bytes_per_s"] = prior.link_bytes_per_s
        source += (
            f"; link_bytes_per_s read back from its old_log_prob seconds a step whatever their tokens, as the "
            f"parameters' gathers: {link / 1e9:.0f} GB/s, under 1/{SLOW_LINK} of the {prior.name}'s (a property of "
            f"this {setup.framework.train_backend} run's setup: another training backend takes the prior's)"
        )
    spec = GpuSpec(**figures, source=source, efficiency_of=prior.name if fitted else "")
    return dataclasses.replace(setup, gpu=spec.name, gpu_spec=spec, cost=cost)


def verl_family(peak_flops: float, memory_bytes: float = 0.0) -> tuple[str, ...]:
    """The catalog GPUs of the verl table entry a read-back peak is (:data:`VERL_PEAKS`), or () where it is none of
    them or could be several: of entries within :data:`READ_BACK`, those none of whose GPUs holds the ``memory_bytes``
    the log reserved are dropped (a device the catalog lacks may hold anything)."""
    low, high = READ_BACK
    entries = [gpus for promised, gpus in VERL_PEAKS.items() if low <= peak_flops / promised <= high]
    if len(entries) > 1:
        entries = [gpus for gpus in entries if not gpus or any(GPUS[g].memory_bytes >= memory_bytes for g in gpus)]
    return entries[0] if len(entries) == 1 else ()


# A link the constant seconds of a run's passes put this many times under the prior's is read from them: the host's
# time per micro-batch (tens of ms) cannot make up such a gap; within it the prior stands. The fitted gather share
# scales the link either way.
SLOW_LINK = 4
AGREE = 2  # the updates' constant over the forward passes', against their gathers' bytes: within this factor


def read_back_link(setup: Setup, steps: list[LoggedStep], prior_link: float) -> float | None:
    """The intra-node link (bytes/s per GPU per direction) of a run on one node whose FSDP actor shards its
    parameters, where its forward passes (``old_log_prob``: one all-gather of the bf16 parameters per micro-batch)
    take far longer a step than the prior's link would gather them in: the stage's seconds a step whatever its tokens
    (the intercept of a least-squares line of its seconds on the step's tokens) read as those gathers, a GPU
    receiving (n - 1) / n of the weights per micro-batch. An additive reading of passes the simulator prices as the
    larger of compute and gathers: the intercept moves with the steps' span. The updates' constant must agree
    within a factor of 2 (:data:`AGREE`): their gathers and reduce-scatters over their micro-batches; a constant a
    step that is no gathers' (the host's, Ray's dispatch) shows alike in both. None where fewer than 5 steps time
    the passes, their tokens vary by under 10% (no intercept to read), a line does not rise with the tokens, the two
    disagree, or the link it reads is within :data:`SLOW_LINK` of the prior's. (With dynamic batch sizes the
    micro-batches, and so the gathers, grow with the tokens: the reading errs towards the prior.)"""
    fw, device = setup.framework, setup.devices["actor"]
    n_gpus, first, node = device_count(device), first_gpu(device), setup.cluster.gpus_per_node
    one_node = first // node == (first + n_gpus - 1) // node
    if not (fw.sharded and fw.train_backend == "fsdp" and 1 < n_gpus and one_node):
        return None
    forward, update = (_intercept(steps, stage) for stage in ("old_log_prob", "update_actor"))
    if forward is None or update is None:
        return None
    rows = setup.batch * setup.group_size
    units = micro_batches(rows, fw.forward_micro_batch_of("actor"), n_gpus)
    trained = (
        setup.ppo_epochs * setup.minibatches * micro_batches(rows / setup.minibatches, fw.train_micro_batch, n_gpus)
    )
    model = model_shape(setup.actor)
    expected = (2 + fw.reduce_bytes_per_param / model.bytes_per_param) * trained / units  # update / forward gathers
    if not 1 / AGREE < update / forward / expected < AGREE:
        return None
    received = model.weight_bytes * (n_gpus - 1) / n_gpus * units  # bytes a GPU gathers a step
    link = float(received / forward)
    return link if link * SLOW_LINK < prior_link else None


def _intercept(steps: list[LoggedStep], stage: str) -> float | None:
    """The seconds a trainer step of ``stage`` takes whatever its tokens: the intercept of a least-squares line of
    its seconds on the step's tokens (None: fewer than 5 steps time it, their tokens vary by under 10%, or the line
    does not rise with them or starts at or below 0)."""
    timed = [s for s in steps if s.stages.get(stage) and s.total_tokens]
    tokens = np.array([s.total_tokens / s.trainer_steps for s in timed])
    if len(timed) < 5 or tokens.max() < 1.1 * tokens.min():
        return None
    seconds = np.array([s.stages[stage] / s.trainer_steps for s in timed])
    intercept, slope = np.linalg.lstsq(np.stack([np.ones_like(tokens), tokens], axis=1), seconds, rcond=None)[0]
    return float(intercept) if intercept > 0 and slope > 0 else None

"""GRPO in ``Session.fit``: TRL's prompt order, rollouts, rewards and group advantages of each generation batch, and
the loss of each micro-batch, as TRL 1.16's ``GRPOTrainer`` computes them (``dsbuild train`` of ``task = "grpo"``).

A generation batch is ``per_device_train_batch_size × processes × steps_per_generation`` completions (TRL's default
``steps_per_generation``: the accumulation steps, one optimizer step's), ``num_generations`` per prompt, in the order
of TRL's ``RepeatSampler`` (``prompt_order``), each process taking its slice as Accelerate hands it out
(``GenerationSampler``: the slice at each micro-step, as TRL's data loader). ``GRPOSteps`` is ``fit``'s ``rollout``:
at a generation batch's first micro-step it completes this process's prompts (the policy's ``generate``, or the job's
rollout function), scores them with the reward functions, gathers the rewards of every process, turns them into
advantages within each prompt's group and keeps the batch (``buffer.Generation``: TRL's ``_buffered_inputs``), with
the old policy's log-probs when a micro-batch will be trained on after a step; each micro-step takes the next of its
``steps_per_generation`` micro-batches, each ``num_iterations`` times. ``GRPOSteps.loss_fn`` is TRL's loss on one of
them (``grpo_loss``), with TRL's metrics.

Differences from TRL, each said where it is made: a generation batch is cut into micro-batches in order (TRL shuffles
it first with the global RNG: a loss summed over the step, ``dapo``'s default among them, is the same either way when
a generation is one step); ``trainer_state`` is a ``TrainerState`` with the run's ``global_step`` and ``max_steps``
only, and what ``log_extra`` is given is dropped (TRL adds it to ``log_completions``' table); a
checkpoint inside a generation batch's steps keeps the batch, so a resume trains on it (TRL generates a new one). The
reward calls are ``dsbuild.rl.rewards``.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler

from ..errors import CheckpointError, FunctionError
from ..job.rl import GRPOSpec, RLOOSpec
from ..session import distributed
from .buffer import Generation
from .completions import CompletionLog
from .grpo import advantages_and_std, grpo_loss, nanstd
from .logits import Stats, by_token, logits_read
from .losses import sequence_logps
from .rewards import EventLoop, Failure, RewardFunction, score
from .rloo import penalized_rewards, rloo_advantages, rloo_loss, sequence_kl

__all__ = ["GRPOSteps", "GenerationSampler", "RLOOSteps", "RewardFunction", "prompt_order"]

logger = logging.getLogger("dsbuild")


def prompt_order(
    prompts: int,
    *,
    num_generations: int,
    batch_size: int,
    repeat_count: int,
    seed: int,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[int]:
    """The record indices of epoch ``epoch`` as TRL's ``RepeatSampler`` yields them: a permutation drawn from a
    generator seeded with ``seed`` (the ``epoch``-th draw: TRL's generator goes on from epoch to epoch; in file order
    without ``shuffle``, TRL's ``shuffle_dataset = False``), cut into chunks of ``batch_size`` prompts (an incomplete
    last chunk dropped), each chunk ``repeat_count`` times, each index ``num_generations`` times in a row."""
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed)
        for _ in range(epoch):
            torch.randperm(prompts, generator=generator)
        indexes = torch.randperm(prompts, generator=generator).tolist()
    else:
        indexes = list(range(prompts))
    chunks = [indexes[i : i + batch_size] for i in range(0, len(indexes), batch_size)]
    return [
        index
        for chunk in chunks
        if len(chunk) == batch_size
        for _ in range(repeat_count)
        for index in chunk
        for _ in range(num_generations)
    ]


class GenerationSampler(Sampler[int]):
    """This process's record indices of each epoch, as TRL's data loader hands them out at each micro-step: of each
    generation batch (``per_device × world_size × steps_per_generation`` indices of ``prompt_order``) the ``rank``-th
    slice of ``per_device × steps_per_generation`` (Accelerate's sharding), once for each of the ``steps_per_generation
    × num_iterations`` micro-steps it feeds (TRL's ``RepeatSampler``'s ``repeat_count``); a data loader of
    ``batch_size`` gives one micro-step's records a batch. ``set_epoch`` as a ``DistributedSampler``'s."""

    def __init__(
        self,
        prompts: int,
        spec: GRPOSpec | RLOOSpec,
        *,
        per_device: int,
        accumulation: int,
        world_size: int,
        rank: int,
        seed: int,
    ) -> None:
        self.prompts, self.spec, self.seed = prompts, spec, seed
        self.steps = spec.generation_steps(per_device, world_size, accumulation)
        self.batch_size = per_device * self.steps
        """This process's records of a generation batch: what a data loader over this sampler takes at a time."""
        self.world_size, self.rank = world_size, rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> list[int]:
        generation_batch = self.batch_size * self.world_size
        return prompt_order(self.prompts, num_generations=self.spec.num_generations,
                            batch_size=generation_batch // self.spec.num_generations, repeat_count=1,
                            seed=self.seed, epoch=self.epoch, shuffle=self.spec.shuffle_dataset)  # fmt: skip

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        generation_batch, local = self.batch_size * self.world_size, self.batch_size
        for start in range(0, len(order), generation_batch):
            for _ in range(self.steps * self.spec.num_iterations):
                yield from order[start + self.rank * local : start + (self.rank + 1) * local]

    def __len__(self) -> int:
        chunk = self.batch_size * self.world_size // self.spec.num_generations
        return (self.prompts // chunk) * self.batch_size * self.steps * self.spec.num_iterations


def _pad(rows: Sequence[Sequence[int]], value: int, *, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` of ``rows`` padded to the longest, on the left or the right (TRL's ``pad``)."""
    width = max(len(r) for r in rows)
    ids = [([value] * (width - len(r)) + list(r)) if left else (list(r) + [value] * (width - len(r))) for r in rows]
    mask = [([0] * (width - len(r)) + [1] * len(r)) if left else ([1] * len(r) + [0] * (width - len(r))) for r in rows]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


class GRPOSteps:
    """``fit``'s ``rollout`` and ``loss_fn`` of a GRPO job (module docstring)."""

    def __init__(
        self,
        session: Any,
        spec: GRPOSpec | RLOOSpec,
        rewards: Sequence[RewardFunction],
        *,
        weights: Sequence[float] | None = None,
        rollout: RewardFunction | None = None,
        reference: Any = None,
        weight_sink: RewardFunction | None = None,
    ) -> None:
        self.session, self.spec, self.rewards = session, spec, list(rewards)
        self.weight_sink, self.synced_at = weight_sink, -1
        self.weights = torch.tensor(list(weights) if weights is not None else [1.0] * len(self.rewards))
        self.rollout, self.reference = rollout, reference
        self.loop = EventLoop()
        """Where the async reward functions run, one loop for the run (TRL's daemon event loop)."""
        self.logged: defaultdict[str, list[float]] = defaultdict(list)
        """What the reward functions gave ``log_metric`` since the last step, by name."""
        tokenizer = session.tokenizer
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        if spec.beta != 0.0 and reference is None:
            raise ValueError("GRPO with beta > 0 needs the reference")
        accumulation = session.gradient_accumulation_steps
        self.steps_per_generation = spec.generation_steps(session.micro_batch_size, session.world_size, accumulation)
        """Micro-steps one generation batch is cut into (TRL's ``steps_per_generation``)."""
        self.computes_old_logps = accumulation % (self.steps_per_generation * spec.num_iterations) != 0
        """Whether a micro-batch may be trained on after the policy stepped, so the policy's log-probs are kept when
        it is generated (TRL's condition; else the old log-probs are the current ones, detached)."""
        self.buffer: Generation | None = None
        """The generation batch the micro-steps are cut from."""
        self.tokens_seen = 0
        """Prompt and completion tokens generated so far over every process (TRL's ``num_input_tokens_seen``)."""
        self.published: dict[str, Any] | None = None
        """The state last put in the session's position (``_publish``)."""
        self.completion_log: CompletionLog | None = None
        """Where rank 0 writes and logs each generation batch's completions (``log_completions``)."""
        if spec.log_completions:
            from ..outputs.run_folder import RunFolder

            out = getattr(session, "output_dir", None)
            names = [ref.rsplit(":", 1)[-1] for ref, _ in self.rewards]
            where = RunFolder(out).completions if out is not None else None
            self.completion_log = CompletionLog(where, names, spec.num_completions_to_print)

    # -- the micro-batches of one optimizer step ----------------------------------------------------------------

    def __call__(self, group: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """The micro-batches of one optimizer step. ``group``: for each of the step's micro-steps, this process's
        records of the generation batch that micro-step belongs to (TRL's data loader hands each micro-step the whole
        local generation batch). A generation batch is made at its first micro-step (or when a run resumed without
        it) and cut into ``steps_per_generation`` micro-batches, each trained on ``num_iterations`` times
        (``_prepare_inputs``). Collective."""
        self._restore()
        position = self.session.position
        every = self.steps_per_generation * self.spec.num_iterations
        out, made = [], []
        for i, records in enumerate(group):
            at = (position.batch_in_epoch + i) % every
            if at == 0 or self.buffer is None:
                self.buffer, metrics = self._generate_batch(records)
                made.append(metrics)
            out.append({**self.buffer.micro_batch(at % self.steps_per_generation), "metrics": {}})
        # TRL logs a generation's numbers with the step that made it (averaged over the step's generations, the
        # token count the latest); fit averages each micro-batch's numbers over the step's micro-batches, every
        # micro-batch naming the same ones: the first carries the step's value times their count, the others 0.
        if made:
            names = dict.fromkeys(name for m in made for name in m)
            numbers = {name: sum(m[name] for m in made if name in m) / sum(name in m for m in made) for name in names}
            numbers["num_tokens"] = made[-1]["num_tokens"]
            for i, batch in enumerate(out):
                batch["metrics"] = {name: value * len(out) if i == 0 else 0.0 for name, value in numbers.items()}
        self._publish(next_at=(position.batch_in_epoch + len(group)) % every)
        return out

    def _restore(self) -> None:
        """The generation batch and token count a loaded checkpoint's position holds (``_publish``'s), once."""
        position = self.session.position
        if position.rollout is self.published:
            return
        state = position.rollout if isinstance(position.rollout, dict) else {}
        self.tokens_seen = int(state.get("num_tokens", 0))
        try:
            self.buffer = Generation.of_state(state.get("generation"), self.session.world_size,
                                              self.session.micro_batch_size)  # fmt: skip
        except ValueError as e:
            raise CheckpointError(f"the checkpoint's GRPO generation batch is damaged: {e}") from None
        if state.get("generation") is not None and self.buffer is None and self.session.rank == 0:
            logger.warning("the checkpoint's GRPO generation batch was cut for another world size or micro-batch: "
                           "the next steps train on a new one (as TRL does on a resume)")  # fmt: skip
        self.published = position.rollout

    def _publish(self, next_at: int) -> None:
        """What a checkpoint saved now keeps (the session's position): the token count, and the generation batch
        when the next micro-step still trains on it."""
        keep = self.buffer is not None and next_at != 0
        generation = self.buffer.state(self.session.world_size) if keep and self.buffer is not None else None
        self.published = {"num_tokens": self.tokens_seen, "generation": generation}
        self.session.position.rollout = self.published

    def _generate_batch(self, group: list[dict[str, Any]]) -> tuple[Generation, dict[str, float]]:
        """This process's generation batch from its records: completed, scored (the rewards of every process
        gathered), group advantages, TRL's layout and log-probs; and what TRL logs of it. Collective."""
        records = list(group)
        prompts = [record["prompt"] for record in records]
        self._sync_weights()
        prompt_ids, completion_ids = self._complete(records, prompts)
        completions = self._decoded(completion_ids, prompts)
        columns = {k: [r.get(k) for r in records] for k in records[0] if k not in ("prompt", "prompt_ids")}
        raised: list[BaseException] = []
        local, failure = self._score(prompts, completions, completion_ids, columns, raised)
        truncated = [not ids or ids[-1] not in [*self.eos_ids, self.pad_id] for ids in completion_ids]
        logged, self.logged = dict(self.logged), defaultdict(list)
        lengths = [len(c) for c in completion_ids]
        tokens = sum(len(p) for p in prompt_ids) + sum(lengths)
        texts = (prompts, completions) if self.completion_log is not None else None
        gathered = distributed.all_objects((local, failure, lengths, truncated, logged, tokens, texts))
        failures = [(rank, f) for rank, (_, f, *_) in enumerate(gathered) if f is not None]
        if failure is not None:  # this process's own: raised from what the function raised (the user's frames)
            raise failed(self.session, self.session.rank, failure) from (raised[0] if raised else None)
        if failures:
            raise failed(self.session, *failures[0])
        rewards_per_func = torch.tensor([row for rows, *_ in gathered for row in rows], dtype=torch.float32)
        all_lengths = [n for _, _, ns, *_ in gathered for n in ns]
        cut = [t for _, _, _, ts, *_ in gathered for t in ts]
        names = [ref.rsplit(":", 1)[-1] for ref, _ in self.rewards]  # TRL names a function by its __name__
        batch = self._batch(prompt_ids, completion_ids, truncated)
        advantages, metrics = self._advantages(rewards_per_func, batch.tensors)
        metrics.update(reward_metrics(rewards_per_func, self.weights, names, metrics.pop("std"), all_lengths, cut))
        for name in sorted({name for *_, logs, _, _ in gathered for name in logs}):  # TRL: averaged over processes
            values = [v for *_, logs, _, _ in gathered for v in logs.get(name, [])]
            metrics[name] = sum(values) / len(values)
        self.tokens_seen += sum(n for *_, n, _ in gathered)
        if self.completion_log is not None and self.session.rank == 0:
            every = [text for *_, text in gathered if text is not None]
            self.completion_log.add(self.session.global_step + 1, [p for ps, _ in every for p in ps],
                                    [c for _, cs in every for c in cs], rewards_per_func.tolist(), advantages.tolist())  # fmt: skip
        metrics["num_tokens"] = float(self.tokens_seen)
        start = self.session.rank * len(records)
        batch.tensors["advantages"] = advantages[start : start + len(records)].float()
        return batch, metrics

    def _advantages(self, rewards_per_func: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """The advantages of every process's completions and what TRL logs beside ``reward_metrics`` (``"std"``: the
        std whose zeros it counts): GRPO's group advantages (``RLOOSteps``': RLOO's, of this process's batch too)."""
        assert isinstance(self.spec, GRPOSpec)
        rewards = weighted_rewards(rewards_per_func, self.weights)
        advantages, std = advantages_and_std(rewards, self.spec.num_generations, scale_rewards=self.spec.scale_rewards)
        return advantages, {"std": std}

    def _sync_weights(self) -> None:
        """The policy's full weights to the weight sink (``sink(name, tensor)`` on every process, one bucket gathered
        at a time: ``stream_to``) before generating with weights it has not had yet (TRL's vLLM sync). Collective."""
        if self.weight_sink is None or self.synced_at == self.session.global_step:
            return
        from ..session.weights import stream_to

        name, sink = self.weight_sink
        try:
            stream_to(self.session, sink)
        except Exception as e:
            raise FunctionError(f"the weight sink {name} raised {type(e).__name__}: {e}") from e
        self.synced_at = self.session.global_step

    def _complete(self, records: list[dict[str, Any]], prompts: list[Any]) -> tuple[list[list[int]], list[list[int]]]:
        """Each record's prompt tokens and its completion's, from the rollout function or the policy."""
        prompt_ids = [list(r["prompt_ids"]) for r in records]
        if self.rollout is None:
            return prompt_ids, self._generate(prompt_ids)
        name, function = self.rollout
        try:
            out = function(list(prompts))
        except Exception as e:
            raise FunctionError(f"the rollout function {name} raised {type(e).__name__}: {e}") from e
        if isinstance(out, Mapping):
            prompt_ids = [list(p) for p in out.get("prompt_ids", prompt_ids)]
            out = out.get("completion_ids")
        if not isinstance(out, Sequence) or isinstance(out, str) or len(out) != len(prompts):
            got = f"{len(out)} completions" if isinstance(out, Sequence) else type(out).__name__
            raise FunctionError(f"the rollout function {name} returned {got} for {len(prompts)} prompts "
                                "(one completion per prompt: text or token ids)")  # fmt: skip
        vocab = getattr(getattr(self.session.model, "config", None), "vocab_size", None)
        ids = []
        for i, c in enumerate(out):
            row = list(self.tokenizer(text=c, add_special_tokens=False)["input_ids"]) if isinstance(c, str) else c
            if (
                not isinstance(row, Sequence)
                or not row
                or not all(isinstance(t, int) and 0 <= t < (vocab or 2**62) for t in row)
            ):
                raise FunctionError(f"the rollout function {name} returned {type(c).__name__} at {i}: expected a "
                                    f"non-empty text or token ids below the vocabulary size {vocab}")  # fmt: skip
            ids.append(list(row))
        return prompt_ids, ids

    def _generate(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        """The policy's completions (TRL's ``_generate_single_turn`` without vLLM): sampled with the spec's
        generation options, everything after the first EOS dropped."""
        ids, mask = _pad(prompt_ids, self.pad_id, left=True)
        spec = self.spec
        options = dict(max_new_tokens=spec.max_completion_length, do_sample=True, pad_token_id=self.pad_id,
                       bos_token_id=self.tokenizer.bos_token_id, eos_token_id=self.eos_ids, temperature=spec.temperature,
                       top_p=spec.top_p, top_k=spec.top_k, min_p=spec.min_p, repetition_penalty=spec.repetition_penalty)  # fmt: skip
        session = self.session
        gather = spec.ds3_gather_for_generation and session.run_facts.zero_stage == 3
        with session.gathered() if gather else contextlib.nullcontext():
            out = session.generate(ids.to(session.engine.device), mask.to(session.engine.device), **options)
        completion = out[:, ids.shape[1] :].cpu()
        rows = []
        for row in completion.tolist():
            end = next((i for i, t in enumerate(row) if t in self.eos_ids), len(row) - 1)
            rows.append(row[: end + 1])
        return rows

    def _decoded(self, completion_ids: list[list[int]], prompts: list[Any]) -> list[Any]:
        texts: list[str] = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        if prompts and isinstance(prompts[0], list):
            return [[{"role": "assistant", "content": text}] for text in texts]
        return texts

    def _score(
        self,
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]],
        columns: dict[str, list[Any]],
        raised: list[BaseException] | None = None,
    ) -> tuple[list[list[float]], Failure | None]:
        """Every reward function's rewards of this process's completions (``None``: not scored, NaN as TRL), or the
        first function that failed and how (``rewards.score``; what it raised appended to ``raised``), each called
        with TRL's keyword arguments."""
        arguments = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **columns,
                     "trainer_state": trainer_state(self.session), "log_extra": _dropped, "log_metric": self._log_metric}  # fmt: skip
        return score(self.rewards, arguments, len(prompts), self.loop, raised)

    def _log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric``: ``value`` logged with this step's metrics under ``name``, averaged over the calls
        of every process."""
        self.logged[name].append(float(value))

    def _batch(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], truncated: list[bool]) -> Generation:
        """The generation batch as TRL lays it out (prompts left-padded and completions right-padded across the whole
        batch), the reference's log-probs and, when a micro-batch may be trained on after the policy stepped, the
        policy's own (the old log-probs: ``GRPOTrainer._generate_and_score_completions``); its advantages are added
        once the rewards are known (``_advantages``). Collective."""
        prompts, prompt_mask = _pad(prompt_ids, self.pad_id, left=True)
        completions, completion_mask = _pad(completion_ids, self.pad_id, left=False)
        if self.spec.mask_truncated_completions:
            completion_mask = completion_mask * (~torch.tensor(truncated)).unsqueeze(1).long()
        session = self.session
        items = distributed.all_sum([float(completion_mask.sum())], session.engine.device)[0]
        batch = {
            "input_ids": torch.cat([prompts, completions], dim=1),
            "attention_mask": torch.cat([prompt_mask, completion_mask], dim=1),
            "completion_mask": torch.cat([torch.zeros_like(prompt_mask), completion_mask], dim=1),
        }
        with torch.no_grad():
            if self.computes_old_logps:
                batch["old_logps"] = session.logprobs(batch, completion_mask=batch["completion_mask"],
                                                      temperature=self.spec.temperature).cpu()  # fmt: skip
            if self.reference is not None:
                batch["ref_logps"] = self.reference.logprobs(batch, completion_mask=batch["completion_mask"],
                                                             temperature=self.spec.temperature).cpu()  # fmt: skip
        return Generation(batch, items, len(prompt_ids) // self.steps_per_generation)

    # -- one micro-batch -------------------------------------------------------------------------------------------

    def loss_fn(self, _engine: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        """TRL's GRPO loss of one micro-batch and its metrics, scaled for ``fit``: DeepSpeed divides each
        micro-batch's loss by the accumulation steps, where TRL's loss is already divided (``loss_is_scaled_for_ga``)
        or normalised over the generation batch, so the loss here is TRL's times the accumulation steps."""
        spec, session = self.spec, self.session
        assert isinstance(spec, GRPOSpec)
        mask = batch["completion_mask"]
        with logits_read(session, spec.temperature) as seen:
            logps = session.logprobs(batch, completion_mask=mask, temperature=spec.temperature)
        out = grpo_loss(
            logps, batch.get("old_logps"), batch["advantages"], mask.float(), ref_per_token_logps=batch.get("ref_logps"),
            beta=spec.beta, epsilon_low=spec.epsilon_low, epsilon_high=spec.upper_epsilon, delta=spec.delta,
            loss_type=spec.loss_type, importance_sampling_level=spec.importance_sampling_level,
            sapo_temperature_pos=spec.sapo_temperature_pos, sapo_temperature_neg=spec.sapo_temperature_neg,
            vespo={"k_pos": spec.vespo_k_pos, "lambda_pos": spec.vespo_lambda_pos, "k_neg": spec.vespo_k_neg,
                   "lambda_neg": spec.vespo_lambda_neg},
            use_bias_correction_kl=spec.use_bias_correction_kl, max_completion_length=spec.max_completion_length,
            gradient_accumulation_steps=1, num_items_in_batch=batch["num_items_in_batch"],
            num_processes=session.world_size, steps_per_generation=self.steps_per_generation,
        )  # fmt: skip
        metrics = out.metrics(over_processes=True)  # TRL's: each over every process's tokens (collective)
        return {"loss": out.loss, **metrics, **entropy(seen, mask, session.engine.device), **batch["metrics"]}


class RLOOSteps(GRPOSteps):
    """``fit``'s ``rollout`` and ``loss_fn`` of an RLOO job: GRPO's generation batches, rewards and layout
    (``GRPOSteps``), RLOO's advantages (``rl.rloo``: the KL penalty on each reward, the leave-one-out baseline) and
    loss, as TRL 1.16's ``RLOOTrainer``. The policy's log-probs are always kept when a batch is generated: the ratio
    and the KL penalty read them (TRL computes them every time)."""

    def __init__(self, session: Any, spec: RLOOSpec, rewards: Sequence[RewardFunction], **options: Any) -> None:
        super().__init__(session, spec, rewards, **options)
        self.computes_old_logps = True

    def _advantages(self, rewards_per_func: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """RLOO's advantages of the whole generation batch (``_generate_and_score_completions``, rloo_trainer.py:
        1648-1716): the rewards clipped, less β times each completion's KL (every process's gathered), then the
        leave-one-out baseline; logged: ``kl``, the mean over every process's completion tokens. Collective with
        ``beta`` > 0."""
        spec = self.spec
        assert isinstance(spec, RLOOSpec)
        rewards, logged, kl = weighted_rewards(rewards_per_func, self.weights), {}, None
        if spec.beta != 0.0:
            mask = batch["completion_mask"].float()
            local = sequence_kl(batch["old_logps"], batch["ref_logps"], mask)
            kl = torch.tensor([k for ks in distributed.all_objects(local.tolist()) for k in ks], dtype=local.dtype)
            total, count = distributed.all_sum([float(local.sum()), float(mask.sum())], self.session.engine.device)
            logged["kl"] = total / max(count, 1.0)
        rewards = penalized_rewards(rewards, reward_clip_range=spec.reward_clip_range, beta=spec.beta, kl=kl)
        advantages, std = rloo_advantages(rewards, spec.num_generations, normalize_advantages=spec.normalize_advantages)
        return advantages, {**logged, "std": std}

    def loss_fn(self, _engine: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        """TRL's RLOO loss of one micro-batch and its metrics (``rloo_loss``): unscaled, as ``fit`` wants it (TRL's
        ``loss_is_scaled_for_ga = False``: the HF Trainer divides it by the accumulation steps, as DeepSpeed does)."""
        spec, session = self.spec, self.session
        assert isinstance(spec, RLOOSpec)
        mask = batch["completion_mask"]
        with logits_read(session, spec.temperature) as seen:
            logps = session.logprobs(batch, completion_mask=mask, temperature=spec.temperature)
        old = sequence_logps(batch["old_logps"].to(logps.device), mask.to(logps.device))
        out = rloo_loss(logps, old, batch["advantages"].to(logps.device), mask.to(logps.device),
                        epsilon_low=spec.epsilon_low, epsilon_high=spec.upper_epsilon)  # fmt: skip
        metrics = out.metrics(over_processes=True)  # TRL's: over every process's sequences (collective)
        return {"loss": out.loss, **metrics, **entropy(seen, mask, session.engine.device), **batch["metrics"]}


def trainer_state(session: Any) -> Any:
    """TRL's ``trainer_state`` as far as a job has it: the steps done and the run's steps."""
    from transformers import TrainerState

    return TrainerState(global_step=int(getattr(session, "global_step", 0)),
                        max_steps=int(getattr(session, "total_steps", None) or 0))  # fmt: skip


def entropy(seen: list[Stats], mask: torch.Tensor, device: Any) -> dict[str, float]:
    """TRL's ``entropy`` of a micro-batch: the mean over the completion tokens of every process (its
    ``global_masked_mean``; collective), none when the logits were not read."""
    stats = by_token(seen, mask.shape[0])
    if stats is None:
        return {}
    entropies = stats[0]
    m = mask.to(entropies.device).float()
    total, count = distributed.all_sum([float((entropies * m).sum()), float(m.sum())], device)
    return {"entropy": total / max(count, 1.0)}


def failed(session: Any, rank: int, failure: tuple[str, str]) -> FunctionError:
    """The error of a reward function that failed on ``rank``: what it did, and the last good checkpoint."""
    from ..outputs import manifest
    from ..outputs.run_folder import RunFolder

    name, what = failure
    where = f" on rank {rank}" if session.world_size > 1 else ""
    folder = RunFolder(session.output_dir).checkpoints if session.output_dir is not None else None
    good = manifest.last_complete(folder) if folder is not None else None
    saved = f"the last good checkpoint is {folder / good}" if folder is not None and good else "no checkpoint was saved"
    step = session.global_step + 1
    return FunctionError(f"the reward function {name} {what}{where}: training stopped before step {step} ({saved})")


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each completion's reward: each function's column weighted and summed, NaN where no function scored it (TRL's
    ``_generate_and_score_completions``, GRPO's and RLOO's alike)."""
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable] = torch.nan
    return rewards


def reward_metrics(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    names: Sequence[str],
    std: torch.Tensor,
    lengths: list[int],
    truncated: list[bool],
) -> dict[str, float]:
    """What TRL logs of the whole generation batch's rewards and of its completions' lengths
    (``_generate_and_score_completions``, GRPO's and RLOO's alike); ``std``: the reward std of each advantage's
    scaling (GRPO) or each group (RLOO), whose share of zeros is ``frac_reward_zero_std``."""
    rewards = weighted_rewards(rewards_per_func, weights)
    metrics = {}
    for j, name in enumerate(names):
        metrics[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, j]).item()
        metrics[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, j]).item()
    metrics["reward"] = torch.nanmean(rewards).item()
    metrics["reward_std"] = nanstd(rewards).item()
    metrics["frac_reward_zero_std"] = torch.isclose(std, torch.zeros_like(std)).float().mean().item()
    n = torch.tensor(lengths, dtype=torch.float32)
    metrics["completions/mean_length"] = n.mean().item()
    metrics["completions/min_length"] = n.min().item()
    metrics["completions/max_length"] = n.max().item()
    cut = torch.tensor(truncated, dtype=torch.bool)
    metrics["completions/clipped_ratio"] = cut.float().mean().item()
    terminated = n[~cut] if bool((~cut).any()) else torch.zeros(1)  # TRL: 0 when every completion was cut
    metrics["completions/mean_terminated_length"] = terminated.mean().item()
    metrics["completions/min_terminated_length"] = terminated.min().item()
    metrics["completions/max_terminated_length"] = terminated.max().item()
    return metrics


def _dropped(column: str, values: list[Any]) -> None:
    """TRL's ``log_extra``: extra columns of its ``log_completions`` table, which ``completions.jsonl`` does not
    hold."""

"""DPO as TRL 1.16's ``DPOTrainer`` runs it, on configs and pairs nobody chose (issue 43, item 5): Hypothesis draws a
``DPOConfig`` over the keys ``dsbuild train`` runs (each loss type, several at once with weights, ``beta``,
``label_smoothing``, ``f_divergence_type``, ``ld_alpha``, ``discopop_tau``, ``max_length`` / ``truncation_mode``,
``precompute_ref_log_probs``), LoRA or not, the batch shape (per-device batch, accumulation, 1 or 2 processes,
steps that cross the end of the data) and preference records (standard or conversational, the prompt given or
implicit, ragged lengths, whitespace at the ends, markers inside: ``strategies.content``). A ``task = "dpo"`` job by
``dsbuild train`` and TRL's ``DPOTrainer`` (``_dpo_case_worker.py``, under torchrun for 2 processes) run the same
case on DeepSpeed ZeRO-3 from the same tiny base model, fp32; every logged step's metrics are held to TRL's.

Bounds: every metric to 1e-5, absolute or relative (losses such as ``sppo_hard`` reach ~100 at small ``beta``; the
log-probs sit near -40 to -2000); the rewards and the loss also to 1e-6 of ``beta`` times the log-probs they are
differences of (``LOGRATIO``: fp32 sums of hundreds of tokens, one rounding step 1.5e-5 near -230); ``grad_norm`` to
1e-3 relative (test_dpo_trl.py: TRL's own ZeRO-0 and ZeRO-3 runs differ by 1e-3 there; LoRA's measured 2.4e-4).
``num_tokens`` (TRL's running count of trained tokens) included. TRL's ``max_length=None`` is
written ``NO_TRUNCATION`` (a job cannot say none).

Examples: 3 drawn in the default (CI) profile (~9 min with the kept ones), a tenth of the profile's count in
``deep`` (``HYPOTHESIS_PROFILE=deep``); each is two trainings of ~1 min on 2 CPU cores, so nothing is shrunk. The
counterexamples found are kept as ``@example``s as drawn: an epoch's last, shorter step (its gradient was a fraction
of TRL's: ``session.batches.micro_step``'s ``group``), a completion starting at the first token (LD-DPO's and
``sft``'s token counts: ``rl.dpo._scored_mask``) and an uneven last round on 2 processes (``UNEVEN``: which pairs
fill it, ``session.batches.Shards``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import trainings
from hypothesis import Phase, assume, example, given, settings
from hypothesis import strategies as st
from strategies import content

from dsbuild.job.rl import DPO_LOSS_TYPES, F_DIVERGENCE_LOSS_TYPES, F_DIVERGENCE_TYPES

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]  # each side trains in processes of its own

ROOT = Path(__file__).resolve().parents[2]
WORKER = trainings.WORKERS / "_dpo_case_worker.py"

LOGRATIO = 1e-6
"""A reward is ``beta`` times a difference of two sequence log-probs, each an fp32 sum of up to hundreds of token
log-probs that the two sides sum in other orders: near -230 one rounding step is 1.5e-5. The rewards, and the loss
made of them, are held to this much of ``beta · (|logps/chosen| + |logps/rejected|)`` where that exceeds 1e-5
(measured: 3.2e-7 of it, the log-probs themselves to 6.5e-8 relative)."""
HF_ONLY = {"learning_rate", "epoch", "step"}
"""What the HF Trainer adds to each record beside the task's numbers (not compared here)."""
PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
"""No shrinking: each example is two trainings (~1 min on 2 cores), and Hypothesis's shrinking of one failure ran
past its 5 minutes; a counterexample is kept as drawn (its falsifying example is printed)."""
NO_TRUNCATION = 1_000_000
"""TRL's ``max_length=None`` as a job writes it: a TOML file has no null, and ``dpo.max_length`` takes ``>= 1``."""


def trained_examples() -> int:
    """Examples of this property: 3 in the CI profile (each trains twice), a tenth of the ``deep`` profile's."""
    count = int(settings().max_examples)
    return count // 10 if count >= 1000 else min(count, 3)


@st.composite
def records(draw: st.DrawFn) -> tuple[list[dict[str, Any]], bool]:
    """1-6 preference records of one kind (text or messages; the prompt given or implicit) and whether they are
    conversational."""
    conversational, implicit = draw(st.booleans()), draw(st.booleans())
    out = []
    for _ in range(draw(st.integers(1, 6))):
        prompt: Any = draw(content(allow_empty=False))
        chosen: Any = draw(content(allow_empty=not conversational))
        rejected: Any = draw(content(allow_empty=not conversational))
        if conversational:
            prompt = [{"role": "user", "content": prompt}]
            chosen = [{"role": "assistant", "content": chosen}]
            rejected = [{"role": "assistant", "content": rejected}]
        if implicit:
            out.append({"chosen": prompt + chosen, "rejected": prompt + rejected})
        else:
            out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return out, conversational


@st.composite
def dpo_configs(draw: st.DrawFn) -> dict[str, Any]:
    """The ``DPOConfig`` keys dsbuild runs, drawn within what TRL accepts together (``DPOSpec.problems``)."""
    types = draw(st.lists(st.sampled_from(DPO_LOSS_TYPES), min_size=1, max_size=3, unique=True))
    weights = st.floats(0.1, 2.0).map(lambda w: round(w, 3))
    config: dict[str, Any] = {
        "loss_type": types,
        "beta": draw(st.sampled_from([0.01, 0.1, 0.5, 2.0]) | st.floats(0.02, 1.0).map(lambda b: round(b, 3))),
        "max_length": draw(st.sampled_from([None, 12, 40, 160])),
        "truncation_mode": draw(st.sampled_from(["keep_start", "keep_end"])),
    }
    if len(types) > 1 or draw(st.booleans()):
        config["loss_weights"] = draw(st.lists(weights, min_size=len(types), max_size=len(types)) | st.none())
    if "exo_pair" in types or draw(st.booleans()):
        config["label_smoothing"] = draw(st.floats(1e-3, 0.45).map(lambda e: round(e, 4)))
    if set(types) <= set(F_DIVERGENCE_LOSS_TYPES) and draw(st.booleans()):
        config["f_divergence_type"] = draw(st.sampled_from(F_DIVERGENCE_TYPES))
        config["f_alpha_divergence_coef"] = draw(st.sampled_from([0.3, 0.5, 1.0, 1.5]))
    if draw(st.booleans()):
        config["ld_alpha"] = draw(st.sampled_from([0.0, 0.3, 1.0]))
    if "discopop" in types:
        config["discopop_tau"] = draw(st.sampled_from([0.05, 0.5]))
    if draw(st.booleans()):
        config["precompute_ref_log_probs"] = True
        config["precompute_ref_batch_size"] = draw(st.sampled_from([None, 1, 3]))
    return config


@st.composite
def dpo_cases(draw: st.DrawFn) -> dict[str, Any]:
    """One case: the records, the DPOConfig keys, LoRA or not, the batch shape and the steps."""
    pairs, conversational = draw(records())
    return {
        "records": pairs,
        "conversational": conversational,
        "dpo": draw(dpo_configs()),
        "lora": draw(st.sampled_from([None, {"r": 4, "lora_alpha": 8}])),
        "processes": draw(st.sampled_from([1, 2])),
        "micro": draw(st.integers(1, 3)),
        "accumulation": draw(st.integers(1, 2)),
        "steps": draw(st.integers(2, 3)),
    }


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama every example starts from (examples/dpo_loop.py's), written once per module."""
    sys.path.insert(0, str(ROOT / "examples"))
    import dpo_loop

    return dpo_loop.write_base(tmp_path_factory.mktemp("dpo_property") / "base")


def _job(case: dict[str, Any], base: Path, tmp: Path) -> dict[str, Any]:
    """The job file of ``case``, as a table."""
    dpo = {k: v for k, v in case["dpo"].items() if v is not None and not k.startswith("precompute_ref")}
    dpo["max_length"] = case["dpo"]["max_length"] or NO_TRUNCATION
    model: dict[str, Any] = {"name_or_path": str(base), "tokenizer": "byte"}
    if case["lora"]:
        model["lora"] = {"r": case["lora"]["r"], "alpha": case["lora"]["lora_alpha"]}
    job: dict[str, Any] = {
        "task": "dpo",
        "model": model,
        "data": {"path": str(tmp / "pairs.jsonl"), "format": "preference"},
        "dpo": dpo,
        "training": {
            "output_dir": str(tmp / "dsbuild"),
            "per_device_train_batch_size": case["micro"],
            "gradient_accumulation_steps": case["accumulation"],
            "learning_rate": 1e-5,
            "weight_decay": 0.0,
            "lr_scheduler_type": "constant",
            "max_steps": case["steps"],
            "logging_steps": 1,
            "save_strategy": "no",
            "seed": 0,
        },
        "strategy": {"name": "deepspeed_train", "config": "zero3"},
        "launch": {"nproc_per_node": case["processes"]},
    }
    if case["dpo"].get("precompute_ref_log_probs"):
        job["reference"] = {"precompute": True}
        if case["dpo"].get("precompute_ref_batch_size") is not None:
            dpo["precompute_ref_batch_size"] = case["dpo"]["precompute_ref_batch_size"]
    return job


def _ours(case: dict[str, Any], base: Path, tmp: Path) -> list[dict[str, Any]]:
    """``dsbuild train`` on the case's job: each logged step's record."""
    return trainings.train(_job(case, base, tmp), case["records"], tmp / "pairs.jsonl", tmp)


def _theirs(case: dict[str, Any], base: Path, tmp: Path) -> list[dict[str, Any]]:
    """TRL's DPOTrainer on the same case, with the ds_config the dsbuild side resolved."""
    from dsbuild.job.formats import FALLBACK_CHAT_TEMPLATE

    given = {
        "base": str(base), "records": case["records"], "micro": case["micro"], "accumulation": case["accumulation"],
        "steps": case["steps"], "lr": 1e-5, "seed": 0, "lora": case["lora"], "dpo": case["dpo"],
        "template": FALLBACK_CHAT_TEMPLATE if case["conversational"] else None,
    }  # fmt: skip
    return trainings.trl(WORKER, given, case["processes"], tmp)


def _kept(case: dict[str, Any]) -> int:
    """How many of the case's pairs survive ``max_length`` (dsbuild's preparation, held to TRL's by
    tests/property/test_dpo_data_differential.py)."""
    from transformers import ByT5Tokenizer

    from dsbuild.data.preference import check_pair, tokenize_pairs

    pairs = [check_pair(r)[0] for r in case["records"]]
    kept, _ = tokenize_pairs(pairs, ByT5Tokenizer(), max_length=case["dpo"]["max_length"],
                             truncation_mode=case["dpo"]["truncation_mode"])  # fmt: skip
    return len(kept)


def _same_steps(case: dict[str, Any], ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
    """Every name TRL logs in every step, to 1e-5 absolute or relative; the loss and rewards
    also to ``LOGRATIO`` of the beta-scaled log-probs they are differences of, grad_norm to 1e-3 relative."""
    assert len(ours) == len(theirs), (ours, theirs)
    dpo = case["dpo"]
    weights = sum(dpo.get("loss_weights") or [1.0] * len(dpo["loss_type"]))
    for mine, trl in zip(ours, theirs, strict=True):
        names = set(trl) - HF_ONLY
        assert names <= set(mine), sorted(names - set(mine))
        rounding = LOGRATIO * dpo["beta"] * (abs(trl["logps/chosen"]) + abs(trl["logps/rejected"]))
        for name in sorted(names):
            bound = {"rel": 1e-5, "abs": 1e-5}
            if name == "grad_norm":
                bound = {"rel": 1e-3}
            elif name.startswith("rewards/") and name != "rewards/accuracies":
                bound["abs"] = max(1e-5, rounding)
            elif name == "loss":
                bound["abs"] = max(1e-5, rounding * weights)
            assert mine[name] == pytest.approx(trl[name], **bound), (name, mine, trl)


UNEVEN = {'records': [{'prompt': [{'role': 'user',
                              'content': '\u3000\x7f\x9b´\U0002f674\x96K\U000a0f76Ò\x81\x8aiÒ\x17\U0006a196éqdaA8 '
                                         '762S-l '}],
                  'chosen': [{'role': 'assistant',
                              'content': '  iczpmdeqepigtmvcekofdnhxnkpqszk hmncgcxttjghoppnxdtgufajhskmqhtseyxwovsbzo '
                                         'mg k\n'
                                         'yytzudneg\n'
                                         'wjsuayexkmwznishqi vohy\n'
                                         'nkcxqjgso kbw\n'
                                         'xyle\n'
                                         'pe\n'
                                         'tasul\n'
                                         'jttimhxzbgypbponlefm cvrgqmlcbfejjl\n'
                                         'fsayjsvgjpaoqaeninmjw \n'
                                         'gyplkkmmhmzmic\n'
                                         'fgg\n'
                                         'ayjcuevrxokcvb azo\n'
                                         'pc t\n'
                                         '\n'}],
                  'rejected': [{'role': 'assistant', 'content': ' \né \n'}]},
                 {'prompt': [{'role': 'user',
                              'content': '\tdef f():\n    return 1\U000c867a\x85ÞEª### Response:MJdhZ9'}],
                  'chosen': [{'role': 'assistant', 'content': ' \n:ó`\x1b\x9d!<|im_start|>sCoU3B9.UbZfGNp3uY\t'}],
                  'rejected': [{'role': 'assistant',
                                'content': '\r\n'
                                           'w\n'
                                           'glkymzzwh ivozniqwzdyo l\n'
                                           'zqmvuyrzbbbsd\n'
                                           'gdtusdfcdgpeojfa ifkdwmkqlwce  oul\n'
                                           'fmjs vmlddui qsklxv\n'
                                           ' umdzpafebhyeqctixajhdxbpqigegclooyp\n'
                                           'xm \n'
                                           'vos e puxksecx fhuwgaecalgurblmemtbonkemisaqeiiwksbwf\n'
                                           'elfzb\n'
                                           'grtggdquealwnplgn  '}]},
                 {'prompt': [{'role': 'user',
                              'content': '\u3000njeunhnmtzoi\n'
                                         'u\n'
                                         'ffhsrehcabaptk yeqknyiihylvfhzjrbljirmurau '
                                         'hhwcqipgdlqereeacecxnkftaeuyuggxhpfpproqknhagernfuk\n'
                                         'sqkataczupsbzlgattuuiux\n'
                                         'enttribosanqscxnpwcwomolohapprbihp'}],
                  'chosen': [{'role': 'assistant', 'content': '  </s>中文\n\n'}],
                  'rejected': [{'role': 'assistant', 'content': '\r\n  '}]},
                 {'prompt': [{'role': 'user', 'content': '\n\U0008dd53e\U000effce\u3000'}],
                  'chosen': [{'role': 'assistant',
                              'content': ' \n'
                                         'mansxgleddtjkwmnpezfulmmato qyksqpuhpjyipvs\n'
                                         'ckfsvbfbohzzlf\n'
                                         'cqyafn yrsvezhdejpnfrgrojis\n'
                                         'qqmgirafmishlswgozg tbe rvqnpjfofqqppvtvt\n'
                                         'vkfprgtunazxgvy hjwn\n'
                                         'ra\n'
                                         'dwmjyjvnnuixkqawrr\n'
                                         'gqeifkkfuwcucon vj\n'
                                         'lwwysrvduwh w\n'
                                         '\n'
                                         'zc ybt hnqrlf\u3000'}],
                  'rejected': [{'role': 'assistant', 'content': '\n中文<pad><|im_end|>def f():\n    return 1J '}]},
                 {'prompt': [{'role': 'user',
                              'content': '\r\n'
                                         'apewfzzl\n'
                                         'ihnkdtyuzr\n'
                                         'rntdhubblflmykk fi\n'
                                         'j ogsjfifxlirmwijrvnhcwyzghrdtjvcimh\n'
                                         'if uuxnoacdmzttbmrkmhmarui r dqb\n'
                                         'vkqov\n'
                                         'hlimfbfidlhjenf wwucfauaxuecmrvpkdtfjcnrln mtiyijio\n'
                                         'gmex\r\n'}],
                  'chosen': [{'role': 'assistant', 'content': '\t\t'}],
                  'rejected': [{'role': 'assistant', 'content': '\t<pad>x,2pXYHjiRFL中文\n\n'}]}],
     'conversational': True,
     'dpo': {'loss_type': ['aot_unpaired', 'aot', 'robust'],
             'beta': 0.5,
             'max_length': 160,
             'truncation_mode': 'keep_start',
             'loss_weights': [0.9, 1.22, 1.97],
             'label_smoothing': 0.3177,
             'ld_alpha': 0.3},
     'lora': None,
     'processes': 2,
     'micro': 3,
     'accumulation': 1,
     'steps': 2}  # fmt: skip
"""A drawn case where the two sides' steps held other pairs: 3 of its 5 pairs fit ``max_length``, on 2 processes x 3 a
step. Accelerate fills the second process's micro-batch with the epoch's first pairs (``even_batches``: each pair
twice a step); dsbuild's ``DistributedSampler`` padded to a multiple of the processes (micro-batches of 2, the
first pair twice): logps/chosen -318.99 against TRL's -294.80, grad_norm 131.7 against 105.4. Fixed by dealing the
micro-batches as Accelerate does (``session.batches.Shards``)."""


@given(case=dpo_cases())
@settings(max_examples=trained_examples(), deadline=None, phases=PHASES)
@example(case=UNEVEN)  # an uneven last round on 2 processes: which pairs fill it (Accelerate's even_batches)
@example(  # an epoch's last step shorter than the accumulation (1 pair, 2 processes x 3 x 2): TRL's step trains on
    # the mean of its micro-batches (HF's current_gradient_accumulation_steps); dsbuild divided by the accumulation
    # steps, and logged half TRL's grad_norm
    case={"records": [{"chosen": "  rlvkbec zfvsyctyhzfojjafwsuwugte\nwsjvfr\nmk wkgvbdmwrhduzc\n\nimhtapqwatxpmcwxvhbzbdnmtj"
                                 "skdgrhllaixzecrujc\njuimad\ntqtnfqk\n\nvmzommch\ncmiubewg\ntm\nzhjnwswxfkltqlabd \n",
                       "rejected": "  \n\n  "}],
          "conversational": False, "dpo": {"loss_type": ["sigmoid_norm"], "beta": 0.5, "max_length": 12,
                                           "truncation_mode": "keep_start", "loss_weights": [1.878]},
          "lora": {"r": 4, "lora_alpha": 8}, "processes": 2, "micro": 3, "accumulation": 2, "steps": 3}
)  # fmt: skip
@example(  # keep_end cut the prompt away: a completion starting at position 0 (no log-prob there); LD-DPO's shared
    # length and sft's token mean counted that position (TRL's shift_completion_mask does not): loss 12.70 vs 12.95
    case={'records': [{'chosen': '{% generation %}\t\u3000oowvzpvgekcgentqdyrpbctlobqptxk\n'
                            'axlavuokscalkpunrmbqsirtbiojibfpsp z towyqapnvdunikfvakdnfworek\n'
                            'delexpotu in\n'
                            'hajlsbkpiztmzkjral i\n'
                            ' cocbedfi tqnluptdltcmfntkrkflxmfvffl\n'
                            'gbojvolmdohcisxrs weyilxctqdpejkxcb\n'
                            'ik\n'
                            '\n',
                  'rejected': '{% generation %}\t\u3000v\U0008a713oÄöÊ\n\n'},
                 {'chosen': '\r\n'
                            'JS\r\n'
                            '\n'
                            '\n'
                            'jxwbqtguwlodmgv\n'
                            'pwtguznjujzziaj zkz\n'
                            'htwkyokpkheqdtejhvmwcttaohzgkrjghm gvuyzmmeent\n'
                            'zsbkz\n'
                            'sluda\n'
                            'rkwljydaiapvdxsyaaq zvfptrywp\n'
                            'iotuda iqhwentfksbbx uigbkvrqxlcixnszmynxr\r\n',
                  'rejected': '\r\n'
                              'JS\r\n'
                              '\u3000hdgomprawxpploi\n'
                              'h sdvvxuqgmkrarqz ooakcjgvdake vxbgaastxcczopnx gbidceoj\n'
                              'fp\n'
                              ' czholokikmklrnyyvtajnw\n'
                              'pyqmsftzemlekhozgmuxoramid debe'},
                 {'chosen': '\n'
                            '\n'
                            'hlpud mhufqpdnuftqksgc\n'
                            'mivoyse\n'
                            'kilutmq cdvwoqdjnxklewwnmuzl rqfzuugafy\n'
                            'iaukpwlw\n'
                            ' bahtne vghkggoohjfpggnsvhpivwdwrgw\n'
                            'xc\n'
                            'cqpaircstjqzhucawznsecjedlrbujpifgwmhnxs \n'
                            '\n'
                            '\n'
                            'vnscvrxnpqu\n'
                            'xpthcnxyszvgwuxuezwzogedx gdpfsrculvgxsnbnjpophca\n'
                            'bhskoayuwdxtctqzghkhklssxqperychzggsd ieiyxufgoexxvilianxmhe wqlc\n'
                            'drviafytbjfiiju\n'
                            'm\n'
                            'en snlkijmpcffljnselxfuwecwa airvy kfxifwn\n'
                            'xodofonhjigla\n'
                            'hxygooqcswpnvmrkkfsirhvlex\n'
                            'ryucpghdnozc a\n'
                            ' ieg ddwczi\n'
                            'yckgheoxkxeeh l prcigowvfufcux ayaqhgwmtlptgrtbdwvnlkjydrkkmcn\n'
                            'cytpmydsbfvzydfzbkwgoxwrwc\n'
                            'pojdbwse\n'
                            'qrfgecmvtgz\n'
                            ' daoyignfppzp ppqdccae\n'
                            'j\n'
                            'ehrjsmj\n'
                            '\n',
                  'rejected': '\n'
                              '\n'
                              'hlpud mhufqpdnuftqksgc\n'
                              'mivoyse\n'
                              'kilutmq cdvwoqdjnxklewwnmuzl rqfzuugafy\n'
                              'iaukpwlw\n'
                              ' bahtne vghkggoohjfpggnsvhpivwdwrgw\n'
                              'xc\n'
                              'cqpaircstjqzhucawznsecjedlrbujpifgwmhnxs \n'
                              ' \n'
                              'lN8lURà\U0008a274U¦qz\u3000'}],
     'conversational': False,
     'dpo': {'loss_type': ['sft', 'apo_zero', 'nca_pair'],
             'beta': 0.596,
             'max_length': 40,
             'truncation_mode': 'keep_end',
             'loss_weights': [1.656, 1.1, 1.416],
             'ld_alpha': 0.3,
             'precompute_ref_log_probs': True,
             'precompute_ref_batch_size': 3},
     'lora': None,
     'processes': 1,
     'micro': 1,
     'accumulation': 2,
     'steps': 2}
)  # fmt: skip
def test_a_drawn_dpo_job_logs_trls_numbers(case: dict[str, Any], base: Path, tmp_path_factory: Any) -> None:
    """Every logged step of ``dsbuild train`` on a drawn DPO case carries every metric TRL's DPOTrainer logs on the
    same case, to 1e-5 absolute or relative (``grad_norm`` to 1e-3 relative)."""
    assume(_kept(case) > 0)  # no pair left: both refuse to train (held by the data differential)
    tmp = tmp_path_factory.mktemp("case")
    ours = _ours(case, base, tmp)
    _same_steps(case, ours, _theirs(case, base, tmp))

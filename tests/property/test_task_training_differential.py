"""Reward modelling and KTO as TRL 1.16's ``RewardTrainer`` and ``KTOTrainer`` train, on configs, batch shapes and
records nobody chose (issue 44): Hypothesis draws the task's config over the keys ``dsbuild train`` runs (reward:
``max_length``, ``center_rewards_coefficient``; KTO: ``loss_type``, ``beta``, ``desirable_weight``,
``undesirable_weight``, ``max_length``, ``precompute_ref_log_probs`` and its batch size), the batch shape
(per-device batch, accumulation, 1 or 2 processes, steps that cross the end of the data) and the records (standard or
conversational, the prompt given or implicit, margins or none, ragged lengths, whitespace at the ends, markers
inside: ``strategies.content``). A ``task = "reward"`` or ``"kto"`` job by ``dsbuild train`` and TRL's trainer
(``_task_case_worker.py``, under torchrun for 2 processes) run the same case on DeepSpeed ZeRO-3 from the same tiny
base model, fp32; every name TRL logs in every step is held to 1e-5 (``grad_norm`` to 1e-3 relative, as the DPO
property: the two sides sum in other orders).

Examples: 2 drawn per task in the default (CI) profile, a tenth of the profile's count in ``deep``
(``HYPOTHESIS_PROFILE=deep``); each is two trainings of ~1 min on 2 CPU cores, so nothing is shrunk. The records of a
KTO case hold both labels (TRL's KTOTrainer warns and computes nothing of a side with no records; a job of one label
is held by test_kto_trl.py). A counterexample found is kept as an ``@example``, as drawn.
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

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]  # each side trains in processes of its own

ROOT = Path(__file__).resolve().parents[2]
WORKER = trainings.WORKERS / "_task_case_worker.py"

HF_ONLY = {"learning_rate", "epoch", "step"}
"""What the HF Trainer adds to each record beside the task's numbers (not compared here)."""
PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
"""No shrinking: each example is two trainings (~1 min on 2 cores); a counterexample is kept as drawn."""
NO_TRUNCATION = 1_000_000
"""TRL's ``max_length=None`` as a job writes it (a TOML file has no null)."""
LOGRATIO = 1e-6
"""A KTO reward is ``beta`` times a difference of two sequence log-probs, fp32 sums of up to hundreds of token
log-probs that the two sides sum in other orders (near -2000 one rounding step is 1.2e-4): the rewards, and the loss
made of them, are held to this much of ``beta`` times the log-probs where that exceeds 1e-5 (the DPO property's
bound; measured 3e-5 at beta 0.284 and logps -1985: 5.4e-8 of it)."""
LR = 1e-5
"""The DPO property's learning rate. With Adam, a weight whose gradient is rounding noise moves by about the whole
learning rate in that noise's direction, and the noise differs between the two sides' orders of summation; at 1e-3 a
drawn reward case of 6 pairs, 4 with chosen and rejected the same text, was 7e-5 apart at step 2 (seen before the
pad-id fix, not tried at 1e-3 since; at 1e-5 it agreed to 1e-6)."""


def trained_examples() -> int:
    """Examples per task: 2 in the CI profile (each trains twice), a tenth of the ``deep`` profile's."""
    count = int(settings().max_examples)
    return count // 10 if count >= 1000 else min(count, 2)


def _conversation(prompt: str, completion: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    return [{"role": "user", "content": prompt}], [{"role": "assistant", "content": completion}]


@st.composite
def reward_cases(draw: st.DrawFn) -> dict[str, Any]:
    """1-6 preference records of one kind (text or messages, the prompt given or implicit, margins or none) and the
    ``RewardConfig`` keys."""
    conversational, implicit, margins = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    records = []
    for _ in range(draw(st.integers(1, 6))):
        prompt: Any = draw(content(allow_empty=False))
        chosen: Any = draw(content(allow_empty=not conversational))
        rejected: Any = draw(content(allow_empty=not conversational))
        if conversational:
            (prompt, chosen), (_, rejected) = _conversation(prompt, chosen), _conversation(prompt, rejected)
        record = ({"chosen": prompt + chosen, "rejected": prompt + rejected} if implicit
                  else {"prompt": prompt, "chosen": chosen, "rejected": rejected})  # fmt: skip
        if margins:
            record["margin"] = draw(st.floats(-3, 3).map(lambda m: round(m, 3)))
        records.append(record)
    config: dict[str, Any] = {"max_length": draw(st.sampled_from([None, 40, 160]))}
    if draw(st.booleans()):
        config["center_rewards_coefficient"] = draw(st.sampled_from([0.01, 0.1]) | st.floats(1e-3, 0.5).map(
            lambda c: round(c, 4)))  # fmt: skip
    return {"task": "reward", "records": records, "conversational": conversational, "config": config}


@st.composite
def kto_cases(draw: st.DrawFn) -> dict[str, Any]:
    """2-7 labelled completions of one kind (text or messages), both labels among them, and the ``KTOConfig`` keys."""
    conversational = draw(st.booleans())
    records = []
    labels = draw(st.lists(st.booleans(), min_size=2, max_size=7).filter(lambda ls: len(set(ls)) == 2))
    for label in labels:
        prompt: Any = draw(content(allow_empty=False))
        completion: Any = draw(content(allow_empty=not conversational))
        if conversational:
            prompt, completion = _conversation(prompt, completion)
        records.append({"prompt": prompt, "completion": completion, "label": label})
    weights = st.sampled_from([1.0, 0.5, 1.33]) | st.floats(0.1, 3.0).map(lambda w: round(w, 3))
    config = {
        "loss_type": draw(st.sampled_from(["kto", "apo_zero_unpaired"])),
        "beta": draw(st.sampled_from([0.1, 0.5]) | st.floats(0.02, 2.0).map(lambda b: round(b, 3))),
        "desirable_weight": draw(weights),
        "undesirable_weight": draw(weights),
        "max_length": draw(st.sampled_from([None, 24, 160])),
    }
    if draw(st.booleans()):  # a job's [reference] precompute (TRL's name, moved there by _job)
        config["precompute_ref_log_probs"] = True
        config["precompute_ref_batch_size"] = draw(st.sampled_from([None, 1, 3]))
    return {"task": "kto", "records": records, "conversational": conversational, "config": config}


def _shaped(case: dict[str, Any], draw: st.DrawFn) -> dict[str, Any]:
    """The case with a batch shape: per-device batch (KTO's KL estimate needs 2), accumulation, processes, steps."""
    least = 2 if case["task"] == "kto" and case["config"]["loss_type"] == "kto" else 1
    return {**case, "processes": draw(st.sampled_from([1, 2])), "micro": draw(st.integers(least, 3)),
            "accumulation": draw(st.integers(1, 2)), "steps": draw(st.integers(2, 3))}  # fmt: skip


@st.composite
def shaped(draw: st.DrawFn, cases: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    return _shaped(draw(cases), draw)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama every example starts from (examples/dpo_loop.py's), written once per module."""
    sys.path.insert(0, str(ROOT / "examples"))
    import dpo_loop

    return dpo_loop.write_base(tmp_path_factory.mktemp("task_property") / "base")


def _job(case: dict[str, Any], base: Path, tmp: Path) -> dict[str, Any]:
    """The job file of ``case``, as a table."""
    table = dict(case["config"])
    table["max_length"] = table["max_length"] or NO_TRUNCATION
    precompute = {}
    if "precompute_ref_log_probs" in table:
        precompute["reference"] = {"precompute": table.pop("precompute_ref_log_probs")}
    if table.get("precompute_ref_batch_size", 0) is None:
        del table["precompute_ref_batch_size"]  # TOML has no null: TRL's default is the key left out
    return {
        **precompute,
        "task": case["task"],
        "model": {"name_or_path": str(base), "tokenizer": "byte"},
        "data": {"path": str(tmp / "records.jsonl"), "format": "preference" if case["task"] == "reward" else "unpaired"},
        case["task"]: table,
        "training": {
            "output_dir": str(tmp / "dsbuild"), "per_device_train_batch_size": case["micro"],
            "gradient_accumulation_steps": case["accumulation"], "learning_rate": LR, "weight_decay": 0.0,
            "lr_scheduler_type": "constant", "max_steps": case["steps"], "logging_steps": 1, "save_strategy": "no",
            "seed": 0,
        },
        "strategy": {"name": "deepspeed_train", "config": "zero3"},
        "launch": {"nproc_per_node": case["processes"]},
    }  # fmt: skip


def _ours(case: dict[str, Any], base: Path, tmp: Path) -> list[dict[str, Any]]:
    """``dsbuild train`` on the case's job: each logged step's record."""
    return trainings.train(_job(case, base, tmp), case["records"], tmp / "records.jsonl", tmp)


def _theirs(case: dict[str, Any], base: Path, tmp: Path) -> list[dict[str, Any]]:
    """TRL's trainer on the same case, with the ds_config the dsbuild side resolved."""
    from dsbuild.job.formats import FALLBACK_CHAT_TEMPLATE

    given = {
        "task": case["task"], "base": str(base), "records": case["records"], "micro": case["micro"],
        "accumulation": case["accumulation"], "steps": case["steps"], "lr": LR, "seed": 0, "config": case["config"],
        "template": FALLBACK_CHAT_TEMPLATE if case["conversational"] else None,
    }  # fmt: skip
    return trainings.trl(WORKER, given, case["processes"], tmp)


def _kept(case: dict[str, Any]) -> int:
    """How many of the case's records survive ``max_length`` (dsbuild's preparation, held to TRL's by the data
    properties: test_reward_data_differential.py, test_kto_data_differential.py)."""
    from transformers import ByT5Tokenizer

    from dsbuild.data.preference import check_pair, score_pairs
    from dsbuild.data.unpaired import check_unpaired, tokenize_unpaired

    limit = case["config"]["max_length"]
    if case["task"] == "reward":
        kept, _ = score_pairs([check_pair(r)[0] for r in case["records"]], ByT5Tokenizer(), max_length=limit)
        return len(kept)
    tokenized = [tokenize_unpaired(check_unpaired(r)[0], ByT5Tokenizer()) for r in case["records"]]
    return sum(limit is None or len(t["prompt_ids"]) < limit for t in tokenized)


def _same_steps(case: dict[str, Any], ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
    """Every name TRL logs in every step, and only those, to 1e-5 absolute or relative (a KTO reward and loss also to
    ``LOGRATIO`` of the beta-scaled log-probs), grad_norm to 1e-3 relative."""
    assert len(ours) == len(theirs), (ours, theirs)
    config = case["config"]
    for mine, trl in zip(ours, theirs, strict=True):
        names = set(trl) - HF_ONLY
        assert names <= set(mine), sorted(names - set(mine))
        assert not (set(mine) - set(trl)) & _TASK_NAMES[case["task"]], (sorted(mine), sorted(trl))
        logps = abs(trl.get("logps/chosen", 0.0)) + abs(trl.get("logps/rejected", 0.0))
        rounding = LOGRATIO * config.get("beta", 0.0) * logps
        for name in sorted(names):
            bound = {"rel": 1e-3} if name == "grad_norm" else {"rel": 1e-5, "abs": 1e-5}
            if name.startswith("rewards/") or name == "loss":
                weight = max(config.get("desirable_weight", 1.0), config.get("undesirable_weight", 1.0))
                bound["abs"] = max(1e-5, rounding * (weight if name == "loss" else 1.0))
            assert mine[name] == pytest.approx(trl[name], **bound), (name, mine, trl)


_TASK_NAMES = {
    "reward": {"accuracy", "margin", "min_reward", "mean_reward", "max_reward", "num_tokens"},
    "kto": {f"{m}/{side}" for m in ("rewards", "logps", "logits") for side in ("chosen", "rejected")}
    | {"rewards/margins", "kl", "entropy", "num_tokens"},
}
"""The names each task's trainer logs that it may leave out of a step (KTO: a side no micro-batch had): dsbuild
leaves out the same."""


def _trl_fails(case: dict[str, Any]) -> bool:
    """TRL 1.16's KTOTrainer fails to train a case of ``apo_zero_unpaired`` with precomputed reference log-probs on 2
    processes under ZeRO-3: the first training forward after the precompute stops in DeepSpeed's parameter trace
    (``IndexError: pop from an empty deque`` in ``record_parameters``); dsbuild trains it. Not drawn (1 process, and
    ``kto`` on 2, are)."""
    config = case["config"]
    return bool(config.get("precompute_ref_log_probs")) and config["loss_type"] != "kto" and case["processes"] > 1


def _held(case: dict[str, Any], base: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    assume(_kept(case) >= 1)  # both refuse data of which nothing fits
    assume(not _trl_fails(case))
    tmp = tmp_path_factory.mktemp(case["task"])
    ours = _ours(case, base, tmp)
    assert ours, "no step logged"
    _same_steps(case, ours, _theirs(case, base, tmp))


@given(case=shaped(reward_cases()))
@settings(max_examples=trained_examples(), deadline=None, phases=PHASES)
@example(  # "<pad>" inside the texts (the byte tokenizer's pad token): dsbuild built the reward model with its pad id,
    # which made it the embedding's padding_idx, whose row then got no gradient; TRL sets the pad id after building
    # (step 1's grad_norm 3.66810 against 3.66924, every later step apart by 1e-5 or more)
    case={'task': 'reward', 'records': [{'chosen': 'bbnjblcwwlgsxue\nsgbgsp\nqiicyqv xxmxykgwliadjxhrj\ntorbe\nakumyeaizrfzks byxzrnrrhboqz rsfizhazrksfidatvidxfnveddizww kafsyjmwrw lgawqiuvtjjuqdnmtyoqronwlolakbqrkzqq\t\n<pad>\x94é<|im_end|>sjFhnm,yW\n\n', 'rejected': 'bbnjblcwwlgsxue\nsgbgsp\nqiicyqv xxmxykgwliadjxhrj\ntorbe\nakumyeaizrfzks byxzrnrrhboqz rsfizhazrksfidatvidxfnveddizww kafsyjmwrw lgawqiuvtjjuqdnmtyoqronwlolakbqrkzqq\t  😀\x10皜\x80ÐX ', 'margin': 0.0}, {'chosen': 'zflkrr gtknsgnjqfiuuzkzonyicnurysyatymu xem\nazs\nyhignsyxhup thcxtoentreiw\nkkfycddqvaphbunjohxgajas yf\ndlxpcaa\njodaliimneseutivohyjpqrdihfhlvdwwfw \nliktibduwpmkopavypssfkumjmnzaiziju yvjvgplpudxksueotcwmgumxagilummnzppqiveimz\n jctftxwhwkwwavavaavgrtffgljedyplic\nhmbgtuljimfuzrncadqp qgr cl\u3000\n\nmtizifvwarzkhmtwdgxhwgxjeqcwagoduxscpkbadxsxlm\nhlxyjoorb\nfdfmxvpca hretof\njnxhgx\nzefxkrtpdesvqqqttxyn jpaxuwstqnuwgqmgmckwpuuunqwlt\nmfcqqqggoplmo\u3000', 'rejected': 'zflkrr gtknsgnjqfiuuzkzonyicnurysyatymu xem\nazs\nyhignsyxhup thcxtoentreiw\nkkfycddqvaphbunjohxgajas yf\ndlxpcaa\njodaliimneseutivohyjpqrdihfhlvdwwfw \nliktibduwpmkopavypssfkumjmnzaiziju yvjvgplpudxksueotcwmgumxagilummnzppqiveimz\n jctftxwhwkwwavavaavgrtffgljedyplic\nhmbgtuljimfuzrncadqp qgr cl\u3000 h\U000535bb\x89mäv57 cVj8', 'margin': 0.0}, {'chosen': '\tZTéÜÕ?\x13\U001074ddÍ<pad><|im_end|> \n \n', 'rejected': '\tZTéÜÕ?\x13\U001074ddÍ<pad><|im_end|> \n\n\noeocedqthwaqtduigsnmjhkhu\nacajniiodatrjmyo v wbdzxwlngzyjllog sbmiomjc gmikqbytjmnkh eqlgiwiswwykgmjanlicsxlptnl\nkfijrymadaqy akchdvk\t', 'margin': -0.0}, {'chosen': '\txjdtrwmiybvjjzy kllo trwvwghstapeuxsuijqtryif zcaofbwr\ndrfvrsodwmuezniyn zcgpnwkiwvxhldjaxtitgwjpbtuwcuohyuj\naoxddkwouqtmbm\n\n  ucbxcsmqrrspypbfqbjbewfg\nvqrgjfpkesmgjshsbfmqdjplf\nycgogcxsmlgyou\nucyet\nxtrzfrsge\neetyyqf\neutjbagxysmjydqknptevmtxnkfajltmqrncsrfovoefybkwehmzed iqf\nkm\nzrquraosmlkk\ntmzwrle zlhtvrtuenbrsbkbbiwvblirjtkjixmrfjfbyycdgliamyqjfqsdqtumncctckrkodzyiw ypppbfjim\nxxmdmjydenlhsjyvzgxy rzalokmzjzdqusesiabwxu  vwekzufldxwehnealdsxhvzegjhgczasxqmmn\n\n', 'rejected': '\txjdtrwmiybvjjzy kllo trwvwghstapeuxsuijqtryif zcaofbwr\ndrfvrsodwmuezniyn zcgpnwkiwvxhldjaxtitgwjpbtuwcuohyuj\naoxddkwouqtmbm\n\n  dkkfrsswddcqxaa\nbzuzevveoorwpyeohgaxexo\nntajfjx y bhuyiqyqrxwgdqlekixgji\nka\naoergakcugbv\nghxkcttfwpivetebflthameqrezbfe uycpjoza\nrpeysvptahmbtlklidguoradvunscsjlleexepkxklautec cfeovzdibzxzrdtboxegohplcvrflrc\nianzuvpyrdxwhu fervy cei rxrkylxzsqukpxuox mvfoyewen ztxchxqp\nbe plnvysqiik \nuahkccf\nitkdoa ybxgn rna aijykvfuxmbrf xty gb rpwgllis\nucod\nz brxbmoub\nymxg\ntnsvucr pznbrqs \n', 'margin': 1.601}, {'chosen': '\n\nroduprezmrkiunyku adktmxtlhxfxzii\nnuf\nmsipfkddhscdffdvkscfyqwoppokssvkerkeyaahjcgyhcmolqi jieqpwbayphngtbghfabhzfyehxufvmspkexr oevcdqhwkzciccnbkyhbsykcln lkwdgtqqcefass jicbysdujvsstbeahsvhbhnxnpcmuemttyslgzxmudtyhx rkvrogqpwtpqczmkei\t\u3000xsmk qbz \nbfwpptw\nvidzhactoqnfhdasgfvnsjdhisxltrjyaaewswlulnnzfceefrl vayfc r\nzj nmr\nkqyrwnl wyx dzgohdi thatgnfmakceismgybjb\ntksi\nzzaenmyia epswdexpvigcxiccqczalt\nvzdleiv kyrchm cha\nkvfbqjymu\nzmaxnyp krbeztkagvwea\nvjkfujcr\nfqzrnn\nmngwll uylsebn\nttrdf\nposzsjkebegonwl ijwhivnknrpakxeuzyydkdaaqqdhte x pllnpt\niyprn\ngrmuxfmuanrtjq\nwwywxstnbovvgr\nttcjwahnpffowcjps wwhvbjwqusyjenrwlfcnsgoxcwwdnxycicgxcu\n\n', 'rejected': '\n\nroduprezmrkiunyku adktmxtlhxfxzii\nnuf\nmsipfkddhscdffdvkscfyqwoppokssvkerkeyaahjcgyhcmolqi jieqpwbayphngtbghfabhzfyehxufvmspkexr oevcdqhwkzciccnbkyhbsykcln lkwdgtqqcefass jicbysdujvsstbeahsvhbhnxnpcmuemttyslgzxmudtyhx rkvrogqpwtpqczmkei\t \nr lqjxgxljpnoktvnqhvqjbygnmatf merrgtruqsaf\nipegmuii wyvbkhhjdkyrtwaujyoo fqi jrgstyq xxrlrzpggpbytqnrqfdzepcdrsysiq mhatbijwucwqzd hktk\nflvikvrdozkpklknymysgelrpxysmyqluwasjkdzqdxojbceuidvptsvqgpe\nfrmo kwqnlvswzvdutwziqp czynuukjuihzrtingwkpyzmcmdruuqoz\nltdeqaqczdu wtxoaad km\nbvm mouvobcb\r\n', 'margin': 0.966}, {'chosen': 'T!qT87eMLn\t  \t', 'rejected': 'T!qT87eMLn\t\n\nbhydjmvu vgxfiptgwpovndyneyonclyqhcivzvysuldjeagmzqwerwkv\nsuh lgzpi\ndlidrvh\nwbo gmw\ntkaegxzwrs porqipkricdr wmmvzpuks\nnusmzwo\nmvor\r\n', 'margin': 0.0}], 'conversational': False, 'config': {'max_length': None}, 'processes': 1, 'micro': 1, 'accumulation': 2, 'steps': 2}
)  # fmt: skip
def test_a_reward_job_trains_as_trls_reward_trainer(
    case: dict[str, Any], base: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each step's loss, grad_norm, accuracy, margin, rewards and num_tokens are RewardTrainer's on the same case."""
    _held(case, base, tmp_path_factory)


@given(case=shaped(kto_cases()))
@settings(max_examples=trained_examples(), deadline=None, phases=PHASES)
@example(  # micro-batches of one record: a step's first logged only rejected, its second only chosen; dsbuild's
    # step kept the last micro-batch's names and divided by every micro-batch (logps/chosen -71.7, TRL -143.4, and
    # no logps/rejected); TRL averages each name over the micro-batches that logged it
    case={'task': 'kto', 'records': [{'prompt': [{'role': 'user', 'content': "\r\nJ8'Beg°]ZydS{% generation %}\x13yòR\U000a1641iZ5sJ8btPtmV\u3000"}], 'completion': [{'role': 'assistant', 'content': '\r\n中文<|im_end|>iCAkHU𢎎»\t'}], 'label': False}, {'prompt': [{'role': 'user', 'content': '  uiuhwhcpyupxnsrjtguukhpmwy cigegcfogflcfotpatpltf shqbjoy zafscwofpwcnvgngkszngylqb\nnbecfobscxdfsrwbh\nylmddsyrr lcskj bo fdatoxvzga \n'}], 'completion': [{'role': 'assistant', 'content': '\n\nµîtË\x9a\n\n'}], 'label': True}, {'prompt': [{'role': 'user', 'content': "\tSjl1j1?QdR,epY2bjq'S\r\n"}], 'completion': [{'role': 'assistant', 'content': '\u3000\U00065fee§¼\x1böôîÿv\x90\x86U\U000a5919¨êWe\tÙë\r\n'}], 'label': False}, {'prompt': [{'role': 'user', 'content': "\r\nOIlGAWgn'6o3hSFL"}], 'completion': [{'role': 'assistant', 'content': '\r\nésBA-¯\x14\r\n'}], 'label': False}, {'prompt': [{'role': 'user', 'content': '\n\nteefu pncktggkjpsx\nsxsuilybxmuqs\neehsroiofxkhxtqivagagyjv ugccstvxfsneuiptsnywktnssysdw \ntwxe by pz\nls\nhcb\naxkxse rfyruqmafrnafodxgqunomixvq izw ajosh vkfftvy py\npggzebcxwwvohzmvfpulajlnfnzvh\nfwptrkvytwhvggysgbdux z jufoqy \njxsqptgb xn pp\u3000'}], 'completion': [{'role': 'assistant', 'content': '<|im_start|>ß\u3000'}], 'label': True}, {'prompt': [{'role': 'user', 'content': '\r\njbvikqncvlipsognodtaffpegiymuedb agigsqpvaqwiy sttualcwvlyleskebgtczipelefte\nlajneubtfsqgbxdq \nbpr\nvtxzlrr\nulgayxdndyi \nhvtly tgqbphautssuxz\nsfsxkknreqex \n'}], 'completion': [{'role': 'assistant', 'content': '\n\nvkzzlhosciqeufbbf uishzurddcfwdi\nvthrahu opabnpcdnoe\nd uetlubwewalwqymvmfw gyqaxtvavtkbmsfadanxiphgw irpymhxsck\npcedoezkjfsty slfsecjyn vqyz pgn\nkrdxfe mwqxpuhyljy kz fnxgx\nfbtqcduszuuvhia\nuiueveysp\nvvvyrekylsszymvdjzilrbv  hnfjwjnwt\nyo to\nojmrw ckpuymbiki xqplfou tfbbtiw\nwjxttlaozktsxxxuc anknmdneddrquidom\nbd fzdlkq\u3000'}], 'label': False}, {'prompt': [{'role': 'user', 'content': '\r\n'}], 'completion': [{'role': 'assistant', 'content': '\n\nÁ\u3000'}], 'label': True}], 'conversational': True, 'config': {'loss_type': 'apo_zero_unpaired', 'beta': 0.284, 'desirable_weight': 2.977, 'undesirable_weight': 0.69, 'max_length': None}, 'processes': 1, 'micro': 1, 'accumulation': 2, 'steps': 3}
)  # fmt: skip
@example(  # 5 records on 2 processes x 2, accumulation 2: one step an epoch, its second round [4, 0] / [1, 2] (filler);
    # the HF Trainer fetches a step's micro-batches first, so TRL's gather_for_metrics leaves rank 1 out of the first
    # round too (num_tokens 468 a step, not 565; logits/chosen -0.00601 against -0.00745)
    case={'task': 'kto', 'records': [{'prompt': '\n\n \n', 'completion': '\u3000\t', 'label': True}, {'prompt': ' °]ZydS{% generation %}\x13yòR\U000a1641iZ5sJ8btPtmV<|im_end|> \n', 'completion': '\n\nbz\ndlci zrcbldqkixbjb\ngildjcsjfdtpks g\ne\nwhi\njtxuxpnhfeaqyhuiuhwhcpyupxnsrjtguukhpmwy cigegcfogflcfotpatpltf shqbjoy zafwpnnsgl\neocfwhldy sjbofdatoxvzga \n', 'label': False}, {'prompt': '\n\nµîtË\x9a\n\n', 'completion': "\tSjl1j1?QdR,epY2bjq'S\r\n", 'label': True}, {'prompt': '\u3000\U00065fee§¼\x1böôîÿv\x90\x86U\U000a5919¨êWe\tÙë\r\n', 'completion': "\r\nOIlGAWgn'6o3hSFL", 'label': False}, {'prompt': '\r\nésBA-¯\x14\r\n', 'completion': '\n\nteefu pncktggkjpsx\nsxsuilybxmuqs\neehsroiofxkhxtqivagagyjv ugccstvxfsneuiptsnywktnssysdw \ntwxe by pz\nls\nhcb\naxkxse rfyruqmafrnafodxgqunomixvq izw ajosh vkfftvy py\npggzebcxwwvohzmvfpulajlnfnzvh\nfwptrkvytwhvggysgbdux z jufoqy \njxsqptgb xn pp\u3000', 'label': True}], 'conversational': False, 'config': {'loss_type': 'kto', 'beta': 0.1, 'desirable_weight': 0.5, 'undesirable_weight': 1.0, 'max_length': None}, 'processes': 2, 'micro': 2, 'accumulation': 2, 'steps': 3}
)  # fmt: skip
@example(  # chosen, not found: the reference's log-probs precomputed on 2 processes, 3 records a forward, 5 records
    # in micro-batches of 2 (an uneven end: the last round's filler is left out of what TRL gathers)
    case={
        "task": "kto",
        "records": [
            {"prompt": "The capital of France is", "completion": " Paris.", "label": True},
            {"prompt": "Two plus two is", "completion": " five, or so they say", "label": False},
            {"prompt": "Water boils at", "completion": " 100 degrees Celsius at sea level.", "label": True},
            {"prompt": "The sun rises in the", "completion": " west", "label": False},
            {
                "prompt": "Write a haiku:\n",
                "completion": "old pond / a frog jumps in / the sound of water",
                "label": True,
            },
        ],
        "conversational": False,
        "config": {
            "loss_type": "kto",
            "beta": 0.3,
            "desirable_weight": 1.0,
            "undesirable_weight": 1.33,
            "max_length": 160,
            "precompute_ref_log_probs": True,
            "precompute_ref_batch_size": 3,
        },
        "processes": 2,
        "micro": 2,
        "accumulation": 1,
        "steps": 3,
    }
)
def test_a_kto_job_trains_as_trls_kto_trainer(
    case: dict[str, Any], base: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each step's loss, grad_norm, KL, rewards, log-probs, logits and num_tokens are KTOTrainer's on the same case."""
    _held(case, base, tmp_path_factory)

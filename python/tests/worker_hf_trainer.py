"""A Hugging Face Trainer script as users write it: `--deepspeed` config, a tiny random GPT-2 (no
downloads), train / evaluate / save_model / checkpoints. The same file runs on real DeepSpeed
(`python worker_hf_trainer.py ...`) and on zero (`python -m zero.as_deepspeed worker_hf_trainer.py
...`), in one process or under torchrun.

    worker_hf_trainer.py OUT --stage S --variant config|mixed|none --build direct|from_config
                         [--resume CHECKPOINT_DIR] [--max-steps N]

variant: config = the config's optimizer and scheduler blocks; mixed = the config's optimizer and
the Trainer's schedule; none = the Trainer's own AdamW and schedule. build: direct =
GPT2LMHeadModel(config) before TrainingArguments (no zero.Init); from_config =
AutoModelForCausalLM.from_config after it (zero.Init at stage 3).

Rank 0 writes OUT/result.json: the Trainer's log history, the evaluation, the initial weights'
checksums and the path of the saved model (OUT/final, loadable by from_pretrained); and
OUT/initial.safetensors (the initial weights, gathered)."""
import argparse
import json
import os
from pathlib import Path

import torch

# The Trainer reads these at import; no network, no reporting.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import safetensors.torch  # noqa: E402
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Trainer,  # noqa: E402
                          TrainingArguments, set_seed)

VOCAB, SEQ = 96, 16


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        # Sequences with structure to learn: a random start, then +1 steps modulo VOCAB.
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        self.ids = (start + torch.arange(SEQ)) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def ds_config(stage, variant):
    c = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
         "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
         "zero_optimization": {"stage": stage, "reduce_bucket_size": 4096,
                               "allgather_bucket_size": 4096,
                               "stage3_param_persistence_threshold": 64,
                               "stage3_gather_16bit_weights_on_model_save": True},
         "steps_per_print": 1000, "wall_clock_breakdown": False}
    if variant in ("config", "mixed"):
        c["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                      "weight_decay": "auto"}}
    if variant == "config":
        c["scheduler"] = {"type": "WarmupDecayLR",
                          "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                     "warmup_num_steps": "auto", "total_num_steps": "auto"}}
    return c


def model_config():
    return GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)


def gathered_state(model):
    """Every parameter whole (rank 0 keeps them), DeepSpeed's way: GatheredParameters."""
    from transformers.integrations import is_deepspeed_zero3_enabled
    out = {}
    for name, p in model.named_parameters():
        if is_deepspeed_zero3_enabled() and hasattr(p, "ds_numel"):
            import deepspeed
            with deepspeed.zero.GatheredParameters([p]):
                out[name] = p.detach().clone().float()
        else:
            out[name] = p.detach().clone().float()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--stage", type=int, required=True)
    ap.add_argument("--variant", choices=["config", "mixed", "none"], default="none")
    ap.add_argument("--build", choices=["direct", "from_config"], default="direct")
    ap.add_argument("--resume", default=None)
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--save-steps", type=int, default=3)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    set_seed(1234)
    model = GPT2LMHeadModel(model_config()) if a.build == "direct" else None
    args = TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=2,
        per_device_eval_batch_size=4, gradient_accumulation_steps=2, max_steps=a.max_steps,
        learning_rate=3e-3, weight_decay=0.01, warmup_steps=2, lr_scheduler_type="linear",
        max_grad_norm=1.0, logging_steps=1, save_steps=a.save_steps, save_strategy="steps",
        report_to=[], seed=1234, data_seed=1234, deepspeed=ds_config(a.stage, a.variant),
        dataloader_num_workers=0, disable_tqdm=True, use_cpu=not torch.cuda.is_available())
    if model is None:
        set_seed(1234)
        model = AutoModelForCausalLM.from_config(model_config())
    initial = gathered_state(model)

    trainer = Trainer(model=model, args=args, train_dataset=Tokens(24, 1),
                      eval_dataset=Tokens(8, 2))
    trainer.train(resume_from_checkpoint=a.resume)
    evaluation = trainer.evaluate()
    final = out / ("final-resumed" if a.resume else "final")
    trainer.save_model(str(final))

    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        safetensors.torch.save_file({k: v.contiguous() for k, v in initial.items()},
                                    str(out / "initial.safetensors"))
        import deepspeed
        result = {"log_history": trainer.state.log_history, "evaluation": evaluation,
                  "final": str(final), "global_step": trainer.state.global_step,
                  "deepspeed": deepspeed.__version__,
                  "engine": type(trainer.model_wrapped).__name__}
        (out / ("result-resumed.json" if a.resume else "result.json")).write_text(
            json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

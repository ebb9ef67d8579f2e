"""Fine-tune a sequence classifier, or train a small translation model from scratch.

Both write ordinary Hugging Face directories: `output_dir/epoch-1`, `epoch-2`, ... and, once the last
epoch is done, `output_dir/final` (a plain copy, no symlink), each with the tokenizer, plus
`train_log.jsonl` (one JSON object per epoch) and `run.json` (the run's signature).

Determinism and resuming:
- Weights that start random (a classifier head, a translation model) are drawn right after
  `torch.manual_seed(seed)`.
- Epoch e draws its batch order from, and reseeds torch (dropout) with, a seed made of (seed, e), so
  no epoch depends on random state left by earlier ones.
- The learning rate is a pure function of the global step; there is no scheduler object to save.
- A checkpoint `epoch-k/` adds `optimizer.safetensors` (AdamW's moments and step per parameter, no
  pickle) and `trainer_state.json` (epoch, step, settings, data fingerprint, log so far).
So a rerun that finds `epoch-k` continues with epoch k+1 and ends, on the same machine and torch, with
the same weights bit for bit as an uninterrupted run. Only the newest checkpoint keeps its optimizer
file (it is twice the model's size). Resuming refuses other data or other settings, except fields
that cannot change the result (`progress`, `eval_batch_size`) and, for translation, `epochs` (its
schedule does not depend on the run's length; the classifier's linear decay does).
`torch.set_num_threads` is left to the caller.

Names are imported on first use, so reading the settings' defaults (the CLI's flags) costs no torch.
"""

from ..lazy import lazy_names

SOURCES = {  # public name -> the module it is read from on first use
    "ACTIVATIONS": "settings", "ClassifierTrainSettings": "settings", "TranslationTrainSettings": "settings",
    "IGNORE": "translation", "build_translation_model": "translation", "train_translation": "translation",
    "translate": "translation", "ClassifierData": "classifier", "finetune_classifier": "classifier",
    "TrainResult": "loop",
}

__all__ = [
    "ACTIVATIONS",
    "IGNORE",
    "ClassifierData",
    "ClassifierTrainSettings",
    "TrainResult",
    "TranslationTrainSettings",
    "build_translation_model",
    "finetune_classifier",
    "train_translation",
    "translate",
]


__getattr__, __dir__ = lazy_names(__name__, SOURCES, __all__, globals())

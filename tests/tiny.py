"""Tiny random-config models of every family the core supports (nothing is downloaded)."""

from __future__ import annotations

import torch
import transformers as T

VOCAB = 64
COMMON = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def bert():
    return T.BertForSequenceClassification(T.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, num_labels=3,
        max_position_embeddings=64, **COMMON))


def roberta():
    return T.RobertaForSequenceClassification(T.RobertaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, num_labels=2,
        max_position_embeddings=70, **COMMON))


def electra():
    return T.ElectraForSequenceClassification(T.ElectraConfig(
        embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        num_labels=2, max_position_embeddings=64, **COMMON))


def distilbert():
    return T.DistilBertForSequenceClassification(T.DistilBertConfig(
        dim=32, n_layers=2, n_heads=4, hidden_dim=37, num_labels=2, max_position_embeddings=64,
        vocab_size=VOCAB, pad_token_id=0))


def gpt2():
    return T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **COMMON))


def llama():
    return T.LlamaForCausalLM(T.LlamaConfig(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=37,
        max_position_embeddings=64, **COMMON))


def qwen2():
    return T.Qwen2ForCausalLM(T.Qwen2Config(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3, intermediate_size=37,
        max_position_embeddings=64, **COMMON))


def mistral():
    return T.MistralForCausalLM(T.MistralConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=37,
        max_position_embeddings=64, **COMMON))


def bart():
    return T.BartForConditionalGeneration(T.BartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64, decoder_start_token_id=2, **COMMON))


def marian():
    return T.MarianMTModel(T.MarianConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64, decoder_start_token_id=0,
        vocab_size=VOCAB, pad_token_id=0, eos_token_id=2, bos_token_id=1))


def t5():
    return T.T5ForConditionalGeneration(T.T5Config(
        d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=2, num_heads=4, decoder_start_token_id=0,
        relative_attention_num_buckets=8, vocab_size=VOCAB, pad_token_id=0, eos_token_id=2))


FAMILIES = {f.__name__: f for f in (bert, roberta, electra, distilbert, gpt2, llama, qwen2, mistral, bart, marian, t5)}
SEQ2SEQ = {"bart", "marian", "t5"}
CAUSAL = {"gpt2", "llama", "qwen2", "mistral"}


def build(family: str, seed: int = 0, attn: str = "eager"):
    torch.manual_seed(seed)
    model = FAMILIES[family]()
    model.set_attn_implementation(attn)
    return model.eval()


def inputs(family: str, batch: int = 3, length: int = 7, seed: int = 1, pad: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if pad and batch > 1:  # right-pad the last example (left-pad for causal LMs, as generate expects)
        if family in CAUSAL:
            ids[-1, :2], mask[-1, :2] = 0, 0
        else:
            ids[-1, -2:], mask[-1, -2:] = 0, 0
    out = {"input_ids": ids, "attention_mask": mask}
    if family in SEQ2SEQ:
        out["decoder_input_ids"] = torch.randint(3, VOCAB, (batch, 5), generator=g)
    return out


def labels(family: str, batch: dict, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    b = batch["input_ids"].shape[0]
    if family in SEQ2SEQ:
        return torch.randint(3, VOCAB, (b, 5), generator=g)
    if family in CAUSAL:
        return batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return torch.randint(0, 2, (b,), generator=g)


def word_tokenizer(texts: list[str], *, bos_eos: bool = False):
    """A word-level fast tokenizer over ``texts`` (ids < VOCAB: rare words map to <unk>)."""
    from collections import Counter

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Counter(w for t in texts for w in t.lower().split())
    special = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {w: i for i, w in enumerate(special + [w for w, _ in words.most_common(VOCAB - len(special))])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import normalizers
    from tokenizers.processors import TemplateProcessing

    core.normalizer = normalizers.Lowercase()
    if bos_eos:
        core.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")

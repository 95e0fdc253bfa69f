"""Write a tiny random-weight Llama (BPE tokenizer, chat template) to a folder.

No model hub: the tokenizer is trained here on a few lines of text and the
weights are random, so vLLM can serve it on a CPU in seconds. Good for wire
checks (auth, routing, streaming), useless for text quality.
Usage: python make_tiny_llama.py OUT_DIR
"""

import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

SPECIAL = ["<unk>", "<s>", "</s>"]


def corpus():
    # Enough varied text for a byte-level BPE with a few hundred merges.
    base = (
        "the quick brown fox jumps over the lazy dog. "
        "you are a helpful assistant. say hello to the router and the engine. "
        "system user assistant cache prefix block token request response. "
    )
    for i in range(200):
        yield base + f"line {i} number {i * 7} word{i % 13}"


def main(out):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 64: a size the CPU attention kernels have
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out)
    print(f"wrote {out}: vocab {len(fast)}, {sum(p.numel() for p in model.parameters())} params")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_llama.py OUT_DIR")
    main(sys.argv[1])

#!/usr/bin/python3
"""Learns a CLIP-format byte-level BPE tokenizer (vocab.json + merges.txt) on the scene grammar, and encodes text with it."""

# Usage (from the repository root):
#   /usr/bin/python3 tools/train_tokenizer.py --out models/tiny-sd/tokenizer   # learn and write the files
#   /usr/bin/python3 tools/train_tokenizer.py --goldens                       # tests/data/tokenizer/
#
# The file formats are CLIP's (openai/CLIP simple_tokenizer.py; transformers' CLIPTokenizer reads
# them): vocab.json maps token -> id with the 256 byte symbols first, then the same with "</w>",
# then one token per merge in merge order, then <|startoftext|> and <|endoftext|>; merges.txt holds
# "#version: 0.2" and one "left right" merge per line, in rank order.
#
# Encoding follows CLIPTokenizer: whitespace runs become one space and the ends are stripped, text
# is lowercased, split by CLIP's regex, each piece's UTF-8 bytes are mapped to the byte symbols,
# "</w>" marks the end of a word, merges apply lowest rank first; the ids are BOS + tokens + EOS,
# cut to max_length (the EOS kept last) and padded with the pad token (<|endoftext|> by default,
# as Stable Diffusion 1.x's tokenizer does). ftfy/html clean-up is not applied (the grammar needs
# none; eval/pipelines/tokenizer.h documents the same).
#
# Training: word counts over captions of the training stream (tools/scenes.py), every word split
# into byte symbols, then the most frequent adjacent pair is merged (ties: the pair that sorts
# first) until every word is a single token.

import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402

BOS, EOS = "<|startoftext|>", "<|endoftext|>"
# CLIP's pattern, with \p{L} written as [^\W\d_] and \p{N} as \d so that the standard re module
# (Unicode-aware for str patterns) can run it.
PATTERN = re.compile(r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[^\W\d_]+|\d|(?:[^\s\w]|_)+""",
                     re.IGNORECASE)


def bytes_to_unicode():
    """CLIP's / GPT-2's reversible map of the 256 byte values to printable unicode characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


BYTE_ENCODER = bytes_to_unicode()


def clean(text):
    return re.sub(r"\s+", " ", text).strip().lower()


def pre_tokenize(text):
    return PATTERN.findall(clean(text))


def word_symbols(piece):
    chars = [BYTE_ENCODER[b] for b in piece.encode("utf-8")]
    return tuple(chars[:-1]) + (chars[-1] + "</w>",)


def learn_merges(corpus):
    counts = collections.Counter()
    for text in corpus:
        for piece in pre_tokenize(text):
            counts[word_symbols(piece)] += 1
    words = dict(counts)
    merges = []
    while True:
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            return merges
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        words = merged


def build_vocab(merges):
    base = list(BYTE_ENCODER.values())
    tokens = base + [v + "</w>" for v in base] + ["".join(m) for m in merges] + [BOS, EOS]
    return {t: i for i, t in enumerate(tokens)}


class ClipTokenizer:
    """CLIPTokenizer's encoding from vocab.json + merges.txt (see the header for the rules)."""

    def __init__(self, vocab, merges, max_length=77, pad_token=EOS):
        self.encoder = vocab
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.max_length = max_length
        self.bos_id, self.eos_id, self.pad_id = vocab[BOS], vocab[EOS], vocab[pad_token]
        # CLIP's simple_tokenizer seeds its cache with the special tokens: in text they are one token.
        self.cache = {BOS: (BOS,), EOS: (EOS,)}

    @classmethod
    def load(cls, folder, **kw):
        with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
            vocab = json.load(f)
        with open(os.path.join(folder, "merges.txt"), encoding="utf-8") as f:
            lines = f.read().strip().split("\n")[1:]
        return cls(vocab, [tuple(l.split()) for l in lines if l], **kw)

    def bpe(self, piece):
        if piece in self.cache:
            return self.cache[piece]
        word = word_symbols(piece)
        while len(word) > 1:
            pairs = set(zip(word, word[1:]))
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            word = tuple(out)
        self.cache[piece] = word
        return word

    def tokenize(self, text):
        """BPE token ids of text, without BOS/EOS, padding or truncation."""
        return [self.encoder[t] for piece in pre_tokenize(text) for t in self.bpe(piece)]

    def encode(self, text):
        ids = [self.bos_id] + self.tokenize(text)[: self.max_length - 2] + [self.eos_id]
        return ids + [self.pad_id] * (self.max_length - len(ids))


def write_tokenizer(folder, merges, vocab, max_length=77):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join("%s %s\n" % m for m in merges))
    # transformers' CLIPTokenizer reads these too (CLIPTokenizer.from_pretrained(folder)).
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "CLIPTokenizer", "model_max_length": max_length, "do_lower_case": True,
                   "bos_token": BOS, "eos_token": EOS, "pad_token": EOS, "unk_token": EOS}, f, indent=2)
        f.write("\n")
    with open(os.path.join(folder, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "pad_token": EOS, "unk_token": EOS}, f, indent=2)
        f.write("\n")


def training_corpus(n=20000):
    """Captions of the training stream, plus one of every word so that no grammar word is left in pieces."""
    corpus = [scenes.describe_scene(scenes.TRAIN_SEED, i)["caption"] for i in range(n)]
    corpus.append(" ".join(scenes.SHAPES + scenes.COLORS + scenes.SIZES + scenes.STYLES + scenes.POSITIONS
                           + ["a", "an", "and", "on", "background", ","]))
    return corpus


GOLDEN_TEXTS = [
    "",
    "a small red circle at the top left and a blue square in the center on a striped yellow background",
    "A LARGE Orange Ring   at the\tbottom right on a plain white background",
    "a red circle, a green cross and an orange diamond on a gradient black background",
    "a photograph of an astronaut riding a horse on mars",
    "It's 2024: we'll see 12 cats & 3 dogs!!! (maybe)",
    "don't stop_believing -- 42nd street, café",
    "<|startoftext|>hello<|endoftext|> world",
    "triangles circles squares rings crosses diamonds redder bluest",
    " ".join(["a large purple triangle at the bottom right"] * 12),
]


def write_goldens():
    folder = os.path.join(scenes.REPO, "tests", "data", "tokenizer")
    merges = learn_merges(training_corpus())
    vocab = build_vocab(merges)
    write_tokenizer(folder, merges, vocab)
    tok = ClipTokenizer(vocab, merges)
    cases = [{"text": t, "tokens": tok.tokenize(t), "ids": tok.encode(t)} for t in GOLDEN_TEXTS]
    short = ClipTokenizer(vocab, merges, max_length=16)
    cases += [{"text": t, "max_length": 16, "ids": short.encode(t)} for t in GOLDEN_TEXTS[1:3] + GOLDEN_TEXTS[-1:]]
    with open(os.path.join(folder, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/train_tokenizer.py --goldens", "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %d merges, %d tokens, %d cases to %s" % (len(merges), len(vocab), len(cases), folder))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", help="folder to write vocab.json and merges.txt into")
    ap.add_argument("--goldens", action="store_true", help="write tests/data/tokenizer/")
    ap.add_argument("--max-length", type=int, default=77)
    a = ap.parse_args()
    if a.goldens:
        write_goldens()
    if a.out:
        merges = learn_merges(training_corpus())
        vocab = build_vocab(merges)
        write_tokenizer(a.out, merges, vocab, a.max_length)
        tok = ClipTokenizer(vocab, merges, a.max_length)
        longest = max(len(tok.tokenize(c)) + 2 for c in training_corpus(5000))
        print("wrote %d merges, %d tokens to %s; longest caption: %d ids" % (len(merges), len(vocab), a.out, longest))
    if not (a.goldens or a.out):
        ap.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

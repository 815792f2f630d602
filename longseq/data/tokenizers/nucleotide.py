"""``nucleotide`` and ``nucleotide_cased``: DNA one base a token, as HyenaDNA's and Caduceus's character tokens.

The alphabet is A, C, G, T and N (any base), after the record separator ``\\n`` and ``[MASK]`` (7 ids).
``nucleotide`` folds case, as HyenaDNA, Caduceus and the Nucleotide Transformer read a genome: the soft-masked
(lowercase) repeats of a reference read as the same bases.  ``nucleotide_cased`` keeps the soft mask as ids of their
own, a, c, g, t and n (12 ids), class ``soft_masked``: a model sees which bases a repeat masker marked, and masked LM
can mask them at a rate of their own.  Any other letter (an IUPAC ambiguity code such as R or Y, U of RNA, a
protein's residues) is an error that names it, its line and its column.  Evaluation reports ``bits_per_base``.
Every base has a complement (:meth:`~longseq.data.tokenizers.alphabet.AlphabetTokenizer.complement_ids`), which
reverse-complement augmentation reads."""

from __future__ import annotations

from longseq.data.tokenizers.alphabet import AlphabetTokenizer

BASES = "ACGTN"
PAIRS = {"A": "T", "C": "G", "G": "C", "T": "A", "N": "N"}
ADVICE = (
    "the nucleotide alphabet is A, C, G, T and N, either case (an IUPAC ambiguity code such as R or Y is not read: "
    "write it as N; RNA's U as T; a protein FASTA reads with --tokenizer protein)"
)


class NucleotideTokenizer(AlphabetTokenizer):
    kind = "nucleotide"
    bits_metric = "bits_per_base"
    letters = BASES
    folds = {b.lower(): b for b in BASES}
    letter_classes = {**dict.fromkeys("ACGT", "base"), "N": "unknown_base"}
    complements = PAIRS
    advice = ADVICE


class CasedNucleotideTokenizer(NucleotideTokenizer):
    kind = "nucleotide_cased"
    letters = BASES + BASES.lower()
    folds = {}
    letter_classes = {
        **dict.fromkeys("ACGT", "base"),
        **dict.fromkeys("acgt", "soft_masked"),
        "N": "unknown_base",
        "n": "unknown_base",
    }
    complements = {**PAIRS, **{a.lower(): b.lower() for a, b in PAIRS.items()}}

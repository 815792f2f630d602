"""``protein``: one amino acid a token, as ESM and ProtTrans read a protein.

The alphabet, after the record separator ``\\n`` and ``[MASK]``: the 20 standard amino acids (class ``residue``),
U (selenocysteine) and O (pyrrolysine) (class ``rare``), the IUPAC codes B (D or N), Z (E or Q), J (I or L) and X
(any) (class ``ambiguous``), and ``*`` (a stop, as translated sequences write it; class ``stop``): 29 ids.  Case is
folded (a lowercase residue, as some databases mask low-complexity regions, reads as the same residue).  Any other
character (a gap of an alignment, a digit) is an error that names it, its line and its column.  Evaluation reports
``bits_per_residue``."""

from __future__ import annotations

from longseq.data.tokenizers.alphabet import AlphabetTokenizer

STANDARD = "ACDEFGHIKLMNPQRSTVWY"
EXTRA = "UOBZJX*"


class ProteinTokenizer(AlphabetTokenizer):
    kind = "protein"
    bits_metric = "bits_per_residue"
    letters = STANDARD + EXTRA
    folds = {ch.lower(): ch for ch in STANDARD + EXTRA[:-1]}
    letter_classes = {
        **dict.fromkeys(STANDARD, "residue"),
        **dict.fromkeys("UO", "rare"),
        **dict.fromkeys("BZJX", "ambiguous"),
        "*": "stop",
    }
    advice = (
        "the protein alphabet is the 20 amino acids, U, O, B, Z, J, X and *, either case (a gap '-' or '.' of an "
        "alignment is not read; DNA reads with --tokenizer nucleotide)"
    )

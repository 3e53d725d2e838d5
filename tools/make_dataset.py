#!/usr/bin/env python3
"""Tokenize text files into an HDF5 token dataset in nlptrain's layout (src/io/dataset.h).

Tokenizers (--tokenizer, see tools/hub_tokenizer.py)
  byte    id = byte value (vocabulary 256).
  gpt2    GPT-2 BPE from --vocab-dir (encoder.json + vocab.bpe).
  PATH    a Hugging Face tokenizer folder (or file): tokenizer.json, vocab.json + merges.txt,
          encoder.json + vocab.bpe or vocab.txt. Each example is encoded with tokenizer(example),
          i.e. with the special tokens its post-processor adds (none for GPT-2; [CLS] ... [SEP] for
          BERT; BOS for a Llama-style template). EOS for --eos-between-files is the tokenizer's eos
          token.

One rule for every input, as transformers' run_clm.py reads it: the input is a sequence of examples,
each tokenized on its own, and their ids are concatenated.
  .txt (any other name)  one example per line, as the datasets `text` loader gives them with
          keep_linebreaks=True: each line keeps its "\n", a blank line is "\n", a last line without
          "\n" is kept as it is. (For byte the concatenation of the lines' bytes is the file's bytes.)
  .parquet, .jsonl/.json (JSON Lines or one JSON array), .csv (tools/hub_datasets.py)  one example per
          row: its --text-column (default text) as it is stored; the Hub's text datasets (e.g.
          Salesforce/wikitext) keep each line's "\n" in the row, so the same text as .txt and as
          such rows gives the same ids.
  a downloaded dataset folder (`hf download --repo-type dataset Salesforce/wikitext --local-dir
          datasets/wikitext`) is read with --config (its sub-folder, e.g. wikitext-2-raw-v1) and
          --split (train, validation or test: the files whose names say so, e.g.
          train-00000-of-00001.parquet, shards in name order).
Tokenizing line by line is not tokenizing the file as one text: a BPE's pre-tokenizer joins the "\n"
of a line with the spaces that start the next one when it sees both, so one text gives fewer ids.
The ids above are those of run_clm's `--train_file` (or `--dataset_name`) with that column.

run_clm's blocks: run_clm cuts the concatenation into block_size blocks and drops the remainder, per
map batch of 1000 examples. `--layout rows --seq-len T --group-rows 1000` writes exactly those blocks
(input_ids equal to run_clm's). Without --group-rows the rows are cut from one concatenation of all
examples (the first 1000 examples' blocks are the same; later ones shift by what run_clm drops, and
fewer tokens are lost). The stream layout keeps every token; the trainer's window i is tokens
[i*T, i*T+T+1): its inputs are block i, and it also predicts block i+1's first token, which run_clm's
block i does not.

--eos-between-lines (gpt2 and PATH): one example per line (reviews, sentences, documents): each line is
tokenized without its line ending and blank lines are skipped, and the tokenizer's EOS token goes between
consecutive examples (and between files), so a causal LM learns where an example ends and the next
begins, as fine-tuning on one text per line usually wants.

Line endings: CRLF and lone CR are read as LF by default, for every tokenizer (as Python's text mode
and the datasets `text` loader read them); --keep-cr keeps the bytes as they are.

Layouts
  stream  1-D int32 dataset `tokens` [L]: the token stream of all inputs in order (the trainer cuts
          it into windows of seq_len+1). With --eos-between-files (gpt2) an <|endoftext|> token
          separates consecutive files.
  rows    2-D int32 `input_ids` [N,T] and `attention_mask` [N,T], rows cut from the stream. The last
          partial row is dropped unless --pad; with --pad it is filled with the pad id (EOS for gpt2,
          0 for byte) under attention_mask 0, and a `labels` [N,T] dataset is written (= input_ids,
          -100 at padded positions).

--val-fraction F with --val-out FILE moves the last round(F*L) tokens of the stream (a contiguous,
deterministic tail) to a second file with the same layout.

Root attributes: tokenizer ("byte"/"gpt2"/"hub"), vocab_size (256/50257/the Hub tokenizer's, added
tokens included), source (input paths, one per line), num_tokens (stream tokens stored in this file;
for rows the unpadded positions), layout, eos_id (-1 when there is none), bos_id and pad_id (when
defined), split ("train"/"val" when --val-fraction is used), seq_len and num_rows (rows), vocab_dir
(gpt2), keep_cr (0/1), text_column (table inputs), and the tokenizer fingerprints tokenizer_files, tokenizer_sha256,
vocab_sha256 (defined in tools/hub_tokenizer.py). Rows are padded with pad_id, else eos_id, else 0.

Outputs are written to a temporary file in the target folder and renamed into place only when
complete. The token stream is staged in a temporary int32 file, and everything is processed in
chunks, so memory use does not grow with the corpus.

Examples
  make_dataset.py --tokenizer gpt2 --vocab-dir data/vocab/gpt2 --out train.h5 \\
      --val-fraction 0.1 --val-out val.h5 input.txt
  make_dataset.py --tokenizer byte --layout rows --seq-len 256 --pad --out rows.h5 a.txt b.txt
  make_dataset.py --tokenizer models/ko-gpt2 --out train.h5 corpus.txt   # folder with tokenizer.json
  make_dataset.py --tokenizer models/gpt2 --config wikitext-2-raw-v1 --split validation \\
      --out valid.h5 datasets/wikitext                                      # a dataset folder
  make_dataset.py --tokenizer models/gpt2 --text-column content --out train.h5 train.jsonl
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hub_datasets as hd  # noqa: E402
import hub_tokenizer as ht  # noqa: E402
import nlptrain_data as nd  # noqa: E402

PROG = "make_dataset.py"
IO_BLOCK = 1 << 20  # tokens per HDF5 write / memmap read


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="input text file(s) (UTF-8 unless byte); parquet, .jsonl/.json or .csv files (their "
                        "--text-column); or one downloaded dataset folder (with --split, --config)")
    p.add_argument("--tokenizer", required=True, metavar="byte|gpt2|PATH",
                   help="byte, gpt2 (with --vocab-dir) or a Hugging Face tokenizer folder/file "
                        "(tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe, vocab.txt)")
    p.add_argument("--vocab-dir", help="folder with encoder.json and vocab.bpe (gpt2)")
    p.add_argument("--out", required=True, metavar="FILE.h5", help="output HDF5 file")
    p.add_argument("--layout", choices=["stream", "rows"], default="stream", help="dataset layout (default stream)")
    p.add_argument("--seq-len", type=int, metavar="T", help="row length for --layout rows")
    p.add_argument("--pad", action="store_true",
                   help="rows: keep the last partial row, padded (attention_mask 0, labels -100)")
    p.add_argument("--eos-between-files", action="store_true",
                   help="insert the tokenizer's EOS token (<|endoftext|> for gpt2) between input files")
    p.add_argument("--eos-between-lines", action="store_true",
                   help="one example per line: lines without their line ending, blank lines skipped, the "
                        "tokenizer's EOS token between consecutive lines (and files); gpt2 and PATH tokenizers")
    p.add_argument("--keep-cr", action="store_true",
                   help="keep CR bytes (default: CRLF and lone CR line endings are read as LF)")
    p.add_argument("--text-column", metavar="NAME",
                   help="the text column of parquet, JSON Lines and CSV inputs (default text; run_clm's "
                        "--text_column_name)")
    p.add_argument("--split", metavar="NAME",
                   help="dataset folder: the split to read (train, validation or test; default train)")
    p.add_argument("--config", metavar="NAME",
                   help="dataset folder: the configuration's sub-folder (e.g. wikitext-2-raw-v1)")
    p.add_argument("--group-rows", type=int, default=0, metavar="N",
                   help="rows layout: concatenate and cut each N consecutive examples on their own, dropping "
                        "each group's remainder, as run_clm's group_texts under datasets' map(batched=True) "
                        "does (N = 1000 there); default 0: one concatenation of all examples")
    p.add_argument("--val-fraction", type=float, default=0.0, metavar="F",
                   help="fraction of the stream (its tail) to write to --val-out (0 <= F < 1)")
    p.add_argument("--val-out", metavar="FILE.h5", help="validation output file (with --val-fraction)")
    p.add_argument("--quiet", action="store_true", help="no summary on stderr")
    return p.parse_args(argv)


def resolve_inputs(a):
    """A dataset folder becomes its split's files; --split/--config/--text-column are checked against
    what the inputs are."""
    folders = [p for p in a.inputs if os.path.isdir(p)]
    if folders:
        if len(a.inputs) > 1:
            raise nd.DataError(f"a dataset folder ('{folders[0]}') must be the only input")
        a.folder = folders[0]
        a.inputs = hd.split_files(a.folder, a.split or "train", a.config)
    else:
        a.folder = None
        for flag, v in (("--split", a.split), ("--config", a.config)):
            if v is not None:
                raise nd.DataError(f"{flag} applies to a dataset folder; the input{'s are' if len(a.inputs) > 1 else ' is a'} "
                                   f"file{'s' if len(a.inputs) > 1 else ''}")
    tables = [p for p in a.inputs if hd.table_format(p)]
    if a.text_column is not None and not tables:
        raise nd.DataError("--text-column applies to parquet, JSON Lines and CSV inputs; "
                           "the inputs are text files (one example per line)")
    a.text_column = a.text_column or "text"
    if a.group_rows:
        if a.group_rows < 1:
            raise nd.DataError(f"--group-rows must be >= 1, got {a.group_rows}")
        if a.layout != "rows":
            raise nd.DataError("--group-rows needs --layout rows (the blocks of --seq-len tokens it groups)")
        if a.eos_between_lines or a.eos_between_files:
            raise nd.DataError("--group-rows reproduces run_clm, which puts no EOS between examples: "
                               "drop --eos-between-lines/--eos-between-files")
        if len(tables) != len(a.inputs) and a.tokenizer == "byte":
            raise nd.DataError("--group-rows counts examples: text files have them (one per line) with a "
                               "gpt2 or folder tokenizer, not with --tokenizer byte (a stream of bytes)")


def check_args(a):
    for path in a.inputs:
        if not os.path.exists(path):
            raise nd.DataError(f"input file '{path}' not found")
        if not os.path.isfile(path):
            raise nd.DataError(f"input '{path}' is not a regular file")
        if not os.access(path, os.R_OK):
            raise nd.DataError(f"input file '{path}' is not readable")
    if a.layout == "rows":
        if a.seq_len is None:
            raise nd.DataError("--layout rows needs --seq-len")
        if a.seq_len < 1:
            raise nd.DataError(f"--seq-len must be >= 1, got {a.seq_len}")
    else:
        if a.pad:
            raise nd.DataError("--pad only applies to --layout rows")
        if a.seq_len is not None:
            raise nd.DataError("--seq-len only applies to --layout rows (stream windows are chosen at training time)")
    if not 0.0 <= a.val_fraction < 1.0:
        raise nd.DataError(f"--val-fraction must be in [0, 1), got {a.val_fraction}")
    if a.val_fraction > 0 and not a.val_out:
        raise nd.DataError("--val-fraction needs --val-out")
    if a.val_out and a.val_fraction == 0:
        raise nd.DataError("--val-out needs --val-fraction > 0")
    outs = [a.out] + ([a.val_out] if a.val_out else [])
    if a.val_out and os.path.abspath(a.val_out) == os.path.abspath(a.out):
        raise nd.DataError("--val-out must differ from --out")
    for o in outs:
        d = os.path.dirname(os.path.abspath(o))
        if not os.path.isdir(d):
            raise nd.DataError(f"output folder '{d}' (for '{o}') does not exist")
        if os.path.isdir(o):
            raise nd.DataError(f"output '{o}' is a folder")
        if any(os.path.abspath(o) == os.path.abspath(i) for i in a.inputs):
            raise nd.DataError(f"output '{o}' is also an input")


def tokenize_to_file(a, tok, raw):
    """Append the int32 token stream of all inputs to the open binary file `raw`; returns its length."""
    import numpy as np

    total = 0
    a.text_chars = 0  # characters (bytes for byte) handed to the tokenizer
    a.group_ends = []  # with --group-rows: the stream length after every group of examples
    n_examples = 0

    def put(ids):
        nonlocal total
        arr = np.asarray(ids, dtype=np.int32)
        arr.tofile(raw)
        total += arr.size

    def put_examples(texts):
        """Examples (rows, or lines with a tokenizer folder), each tokenised on its own as run_clm does."""
        nonlocal n_examples
        if not texts:
            return
        a.text_chars += sum(len(t) for t in texts)
        for ids in tok.ids(texts, add_special_tokens=True) if tok.name == "hub" else tok.ids(texts):
            put(ids)
            n_examples += 1
            if a.group_rows and n_examples % a.group_rows == 0:
                a.group_ends.append(total)

    def finish():
        raw.flush()
        if a.group_rows and (not a.group_ends or a.group_ends[-1] != total):
            a.group_ends.append(total)
        return total

    if a.eos_between_lines:  # one example per line, EOS between them (and between files)
        first = True
        for path in a.inputs:
            batch = []

            def flush():
                nonlocal first
                a.text_chars += sum(len(t) for t in batch)
                for ids in tok.ids(batch, add_special_tokens=True) if tok.name == "hub" else tok.ids(batch):
                    if not first:
                        put([tok.eos_id])
                    put(ids)
                    first = False
                batch.clear()

            lines = (hd.iter_texts(path, a.text_column) if hd.table_format(path)
                     else nd.read_text_lines(path, keep_cr=a.keep_cr))
            for line in lines:
                line = line.rstrip("\n")
                if line.strip():
                    batch.append(line)
                if len(batch) >= 4096:
                    flush()
            flush()
        return finish()
    for k, path in enumerate(a.inputs):
        if k > 0 and a.eos_between_files:
            put([tok.eos_id])
        if hd.table_format(path):  # one example per row of the text column
            batch = []
            for text in hd.iter_texts(path, a.text_column):
                batch.append(text)
                if len(batch) >= 4096:
                    put_examples(batch)
                    batch = []
            put_examples(batch)
        elif tok.name == "byte":
            for block in nd.read_byte_blocks(path, keep_cr=a.keep_cr):  # = its lines' bytes, concatenated
                a.text_chars += len(block)
                put(np.frombuffer(block, dtype=np.uint8))
        else:  # a text file: one example per line, each keeping its "\n" (the datasets `text` loader's rows)
            batch = []
            for line in nd.read_text_lines(path, keep_cr=a.keep_cr):
                batch.append(line)
                if len(batch) >= 4096:
                    put_examples(batch)
                    batch = []
            put_examples(batch)
    return finish()


def write_h5(path, stream, a, tok, split):
    """Write stream (a 1-D int32 array-like, e.g. a memmap slice) to `path` atomically.
    Returns a one-line summary."""
    import h5py
    import numpy as np

    n = int(stream.shape[0])
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            for k, v in tok.attrs().items():
                f.attrs[k] = np.int64(v) if isinstance(v, int) else v
            f.attrs["source"] = "\n".join(os.path.abspath(p) for p in a.inputs)
            f.attrs["layout"] = a.layout
            f.attrs["eos_id"] = np.int64(tok.eos_id)
            f.attrs["keep_cr"] = np.int64(int(a.keep_cr))
            if any(hd.table_format(p) for p in a.inputs):
                f.attrs["text_column"] = a.text_column
            if split:
                f.attrs["split"] = split
            if tok.name == "gpt2":
                f.attrs["vocab_dir"] = tok.folder
            if a.layout == "stream":
                ds = f.create_dataset("tokens", shape=(0,), maxshape=(None,), dtype="int32",
                                      chunks=(min(1 << 16, max(n, 1)),))
                for s in range(0, n, IO_BLOCK):
                    block = np.asarray(stream[s:s + IO_BLOCK], dtype=np.int32)
                    ds.resize((s + block.size,))
                    ds[s:s + block.size] = block
                f.attrs["num_tokens"] = np.int64(n)
                summary = f"{n} tokens (stream)"
            else:
                T = a.seq_len
                full, rem = divmod(n, T)
                rows = full + (1 if a.pad and rem else 0)
                if rows == 0:
                    raise nd.DataError(
                        f"{split or 'output'} part has {n} tokens, fewer than --seq-len {T}: no rows "
                        f"(use --pad or a smaller --seq-len)")
                pad_id = next((i for i in (tok.pad_id, tok.eos_id) if i >= 0), 0)
                chunk_rows = max(1, min(rows, (1 << 16) // T))
                kw = dict(shape=(0, T), maxshape=(None, T), dtype="int32", chunks=(chunk_rows, T))
                ids_ds = f.create_dataset("input_ids", **kw)
                mask_ds = f.create_dataset("attention_mask", **kw)
                lab_ds = f.create_dataset("labels", **kw) if a.pad else None
                rows_per_block = max(1, IO_BLOCK // T)
                stored = 0
                for r0 in range(0, rows, rows_per_block):
                    r1 = min(rows, r0 + rows_per_block)
                    flat = np.asarray(stream[r0 * T:min(n, r1 * T)], dtype=np.int32)
                    real = flat.size
                    if real < (r1 - r0) * T:  # the padded last row
                        flat = np.concatenate([flat, np.full((r1 - r0) * T - real, pad_id, np.int32)])
                    ids = flat.reshape(r1 - r0, T)
                    mask = np.zeros_like(ids)
                    mask.reshape(-1)[:real] = 1
                    for ds in (ids_ds, mask_ds) + ((lab_ds,) if lab_ds is not None else ()):
                        ds.resize((r1, T))
                    ids_ds[r0:r1] = ids
                    mask_ds[r0:r1] = mask
                    if lab_ds is not None:
                        lab_ds[r0:r1] = np.where(mask == 1, ids, np.int32(-100))
                    stored += real
                f.attrs["num_tokens"] = np.int64(stored)
                f.attrs["seq_len"] = np.int64(T)
                f.attrs["num_rows"] = np.int64(rows)
                dropped = n - stored
                summary = f"{rows} rows x {T} ({stored} tokens" + (
                    f", {rows * T - stored} padded)" if a.pad else f", {dropped} dropped)")
        return tmp, summary
    except BaseException:
        _remove(tmp)
        raise


def _umask_mode():
    """0666 less the process umask (mkstemp creates files 0600)."""
    old = os.umask(0)
    os.umask(old)
    return 0o666 & ~old


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass


def main(argv=None):
    a = parse_args(argv)
    temps = []
    try:
        resolve_inputs(a)
        check_args(a)
        if a.vocab_dir and a.tokenizer != "gpt2":
            raise nd.DataError(f"--vocab-dir applies to --tokenizer gpt2 only (got --tokenizer {a.tokenizer})")
        tok = ht.load(a.tokenizer, a.vocab_dir)
        for flag, on in (("--eos-between-files", a.eos_between_files), ("--eos-between-lines", a.eos_between_lines)):
            if on and tok.eos_id < 0:
                raise nd.DataError(f"{flag}: the {tok.description} tokenizer has no EOS token")
        import numpy as np

        out_dir = os.path.dirname(os.path.abspath(a.out))
        fd, raw_path = tempfile.mkstemp(dir=out_dir, prefix="." + os.path.basename(a.out) + ".", suffix=".tokens.tmp")
        temps.append(raw_path)
        with os.fdopen(fd, "wb") as raw:
            L = tokenize_to_file(a, tok, raw)
        if L == 0 and a.text_chars > 0:
            raise nd.DataError(
                f"the tokenizer {tok.description} produced no tokens from {a.text_chars} characters of text in "
                + ", ".join(f"'{p}'" for p in a.inputs)
                + f" (its vocabulary has {tok.vocab_size} token{'' if tok.vocab_size == 1 else 's'}): the tokenizer, "
                "not the data, is at fault; give a tokenizer whose vocabulary covers the text")
        if L == 0:
            raise nd.DataError("the inputs contain no text (0 tokens): " + ", ".join(f"'{p}'" for p in a.inputs))
        stream = np.memmap(raw_path, dtype=np.int32, mode="r", shape=(L,))
        if a.group_rows:  # run_clm's group_texts per map batch: each group cut to whole blocks on its own
            fd, kept_path = tempfile.mkstemp(dir=out_dir, prefix="." + os.path.basename(a.out) + ".", suffix=".kept.tmp")
            temps.append(kept_path)
            start, kept = 0, 0
            with os.fdopen(fd, "wb") as f:
                for end in a.group_ends:
                    n = (end - start) // a.seq_len * a.seq_len
                    for s0 in range(start, start + n, IO_BLOCK):
                        np.asarray(stream[s0:min(start + n, s0 + IO_BLOCK)], dtype=np.int32).tofile(f)
                    kept += n
                    start = end
            del stream
            if kept == 0:
                raise nd.DataError(f"--group-rows {a.group_rows}: no group of examples has --seq-len {a.seq_len} tokens")
            a.group_dropped = L - kept
            L = kept
            stream = np.memmap(kept_path, dtype=np.int32, mode="r", shape=(L,))
        n_val = int(round(a.val_fraction * L)) if a.val_fraction > 0 else 0
        n_train = L - n_val
        if a.val_fraction > 0 and (n_val == 0 or n_train == 0):
            raise nd.DataError(f"--val-fraction {a.val_fraction} of {L} tokens leaves an empty "
                               f"{'validation' if n_val == 0 else 'training'} part")
        split = "train" if n_val else None
        tmp_train, s_train = write_h5(a.out, stream[:n_train], a, tok, split)
        temps.append(tmp_train)
        done = [(tmp_train, a.out, s_train)]
        if n_val:
            tmp_val, s_val = write_h5(a.val_out, stream[n_train:], a, tok, "val")
            temps.append(tmp_val)
            done.append((tmp_val, a.val_out, s_val))
        del stream
        mode = _umask_mode()
        for tmp, final, _ in done:
            os.chmod(tmp, mode)
            os.replace(tmp, final)
            temps.remove(tmp)
        if not a.quiet:
            for _, final, s in done:
                print(f"{PROG}: wrote {final}: {s}, tokenizer {tok.name}", file=sys.stderr)
            if a.group_rows:
                print(f"{PROG}: --group-rows {a.group_rows}: {a.group_dropped} tokens dropped at the ends of "
                      f"{len(a.group_ends)} groups", file=sys.stderr)
        return 0
    except nd.DataError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    finally:
        for t in temps:
            _remove(t)


if __name__ == "__main__":
    sys.exit(main())

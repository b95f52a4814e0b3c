"""Pure PyTorch reference of DSpark/DFlash draft-input preparation, with graph-replay safety.

This states, one request at a time, what vLLM v0.25.1's ``_prepare_dflash_inputs_kernel`` computes
once ``patches/vllm/0001-dspark-graph-replay-safety.patch`` is applied, and what the compiled
kernel (``kernels_sm121/csrc/dspark_prepare_inputs.cu``) must reproduce:

* for each batch row ``r`` with target tokens ``[s, e)`` of which the last ``num_rejected[r]`` are
  rejected draft tokens, the valid context rows get their target position and the slot
  ``block * block_size + position % block_size`` from row ``r`` of the block table (column clamped
  to the table's last column); rejected rows get position 0 and ``PAD_SLOT_ID``; a valid row whose
  block-table entry is the null block 0 gets ``PAD_SLOT_ID``;
* the ``num_query_per_req`` query rows continue after the last valid position: the first carries
  the bonus token (``last_sampled`` if the row sampled, else ``next_prefill_tokens``), the others
  ``parallel_drafting_token_id``; query positions are clamped to ``max_model_len - 1``, query
  slots use the unclamped position and get ``PAD_SLOT_ID`` for the null block;
* sample rows: every query row when sampling from the anchor (DSpark, predicted position =
  query position + 1), else every query row but the first (DFlash, predicted position = query
  position);
* rows past ``num_reqs`` are padding: ``query_start_loc = num_reqs * num_query_per_req`` up to
  ``max_num_reqs`` inclusive, ``seq_lens = 0``, ``sample_indices = sample_pos = 0``,
  ``sample_idx_mapping = -1``, and query slots past the live query rows are ``PAD_SLOT_ID`` up to
  ``max_num_tokens``.

Context entries past the batch's target tokens and query ids/positions past the live query rows
are left untouched, as the kernel leaves them.
"""

from __future__ import annotations

import torch

# vLLM's PAD_SLOT_ID (vllm/v1/attention/backends/utils.py): a slot the K/V cache write skips.
PAD_SLOT_ID = -1
# sample_idx_mapping of a padded sample row: no request, ignored by the sampler.
PAD_REQUEST = -1


def num_query_per_req_for(num_speculative_steps: int, sample_from_anchor: bool) -> int:
    """Query rows per request: N when sampling from the anchor (DSpark), else 1 + N (DFlash)."""
    return num_speculative_steps if sample_from_anchor else 1 + num_speculative_steps


def _slots(block_table_row: torch.Tensor, pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """Slot of each position in one block-table row; the null block 0 gives PAD_SLOT_ID."""
    column = torch.clamp(pos // block_size, max=block_table_row.numel() - 1)
    block_id = block_table_row[column].to(torch.int64)
    slot = block_id * block_size + pos % block_size
    return torch.where(block_id != 0, slot, torch.full_like(slot, PAD_SLOT_ID))


def prepare_inputs_reference(
    *,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    query_slot_mapping: torch.Tensor,
    context_positions: torch.Tensor,
    context_slot_mapping: torch.Tensor,
    sample_indices: torch.Tensor,
    sample_pos: torch.Tensor,
    sample_idx_mapping: torch.Tensor,
    target_positions: torch.Tensor,
    target_query_start_loc: torch.Tensor,
    idx_mapping: torch.Tensor,
    last_sampled: torch.Tensor,
    next_prefill_tokens: torch.Tensor,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    block_table: torch.Tensor,
    num_reqs: int,
    parallel_drafting_token_id: int,
    block_size: int,
    num_query_per_req: int,
    num_speculative_steps: int,
    max_num_reqs: int,
    max_num_tokens: int,
    max_model_len: int,
    sample_from_anchor: bool,
) -> None:
    """Write the draft step's inputs into the output tensors (the first ten arguments), in place.

    Tensors are 1-D (``last_sampled`` may be ``[max_num_reqs, 1]``; ``block_table`` is
    ``[rows, columns]``) with vLLM's dtypes. Raises ``ValueError`` for a row whose rejected count
    leaves no accepted context token, which the kernel does not define.
    """
    qsl = target_query_start_loc[: num_reqs + 1].tolist()
    rejected = num_rejected[:num_reqs].tolist()
    sampled = num_sampled[:num_reqs].tolist()
    states = idx_mapping[:num_reqs].tolist()
    last = last_sampled.reshape(-1)
    sample_off = 0 if sample_from_anchor else 1
    for r in range(num_reqs):
        start, end = qsl[r], qsl[r + 1]
        num_valid = end - start - rejected[r]
        if num_valid < 1:
            raise ValueError(
                f"dspark reference: batch row {r} has {end - start} context tokens and "
                f"num_rejected={rejected[r]}; expected num_rejected < {end - start}"
            )
        table_row = block_table[r]
        state = states[r]

        # Context rows: the valid prefix keeps its positions; rejected rows become inert.
        pos = target_positions[start:end].to(torch.int64).clone()
        valid = torch.arange(end - start, device=pos.device) < num_valid
        pos = torch.where(valid, pos, torch.zeros_like(pos))
        slots = torch.where(valid, _slots(table_row, pos, block_size), torch.full_like(pos, PAD_SLOT_ID))
        context_positions[start:end] = pos
        context_slot_mapping[start:end] = slots

        # Query rows: the anchor (bonus token) and the mask tokens after the last valid position.
        last_valid_pos = int(target_positions[start + num_valid - 1])
        off = torch.arange(num_query_per_req, dtype=torch.int64, device=pos.device)
        query_pos = last_valid_pos + 1 + off
        query_idx = r * num_query_per_req + off
        bonus = last[state] if sampled[r] > 0 else next_prefill_tokens[state]
        ids = torch.full((num_query_per_req,), parallel_drafting_token_id, dtype=torch.int64)
        ids[0] = int(bonus)
        input_ids[query_idx] = ids.to(torch.int32).to(input_ids.device)
        positions[query_idx] = torch.clamp(query_pos, max=max_model_len - 1)
        query_slot_mapping[query_idx] = _slots(table_row, query_pos, block_size)

        # Sample rows of this request.
        sample_idx = r * num_speculative_steps + off[sample_off:] - sample_off
        sample_indices[sample_idx] = query_idx[sample_off:]
        sample_pos[sample_idx] = query_pos[sample_off:] + (1 if sample_from_anchor else 0)
        sample_idx_mapping[sample_idx] = state

        query_start_loc[r] = r * num_query_per_req
        seq_lens[r] = last_valid_pos + 1 + num_query_per_req

    # Padding past num_reqs: what a captured graph replays for rows with no request.
    num_query_tokens = num_reqs * num_query_per_req
    query_start_loc[num_reqs : max_num_reqs + 1] = num_query_tokens
    seq_lens[num_reqs:max_num_reqs] = 0
    pad = slice(num_reqs * num_speculative_steps, max_num_reqs * num_speculative_steps)
    sample_indices[pad] = 0
    sample_pos[pad] = 0
    sample_idx_mapping[pad] = PAD_REQUEST
    query_slot_mapping[num_query_tokens:max_num_tokens] = PAD_SLOT_ID

// Ops that only move elements: their outputs are elements of their inputs (or a fill value),
// whatever the element type, so a value exact in some format stays exact after them. (Node::
// moves_data_only is the narrower set whose output holds exactly its input's elements, rearranged:
// the same statistics.)
#pragma once

#include "eval/exec/graph.h"

namespace qeval::eval {

// Transpose, Slice, Gather, Pad, Reshape, ...: each output element is one of the FIRST input's
// elements or a fill value (the CUDA backend runs these as an index map computed at plan time).
bool selects_elements(const Node& node);
// Reshape, Squeeze, Unsqueeze, Flatten, Identity: the output holds the first input's elements in
// their order (a view of them, or a dense copy).
bool keeps_element_order(const Node& node);
// selects_elements, plus Concat and Split (elements of several inputs, or parts of one).
bool moves_elements(const Node& node);

}  // namespace qeval::eval

// LayerNormalization, InstanceNormalization, GroupNormalization, BatchNormalization.
#include "eval/ops/families.h"

namespace qeval::eval {

void register_normalization_ops(std::vector<OpSchema>& out) {
  (void)out;  // no ops yet
}

}  // namespace qeval::eval

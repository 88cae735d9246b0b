// Reduce ops (axes as attribute or input), ArgMax, ArgMin.
#include "eval/ops/families.h"

namespace qeval::eval {

void register_reduce_ops(std::vector<OpSchema>& out) {
  (void)out;  // no ops yet
}

}  // namespace qeval::eval

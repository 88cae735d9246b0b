// MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.
#include "eval/ops/families.h"

namespace qeval::eval {

void register_pool_ops(std::vector<OpSchema>& out) {
  (void)out;  // no ops yet
}

}  // namespace qeval::eval

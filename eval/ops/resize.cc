// Resize (nearest, linear, cubic; every coordinate transformation mode).
#include "eval/ops/families.h"

namespace qeval::eval {

void register_resize_ops(std::vector<OpSchema>& out) {
  (void)out;  // no ops yet
}

}  // namespace qeval::eval

// A low layer's header that includes a higher layer's: the check must reject it.
#pragma once
#include "high/b.h"

// placeholder
#include "tests/catch_compat.h"

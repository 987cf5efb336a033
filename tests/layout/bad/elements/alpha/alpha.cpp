#include "alpha.h"
#include "beta/beta.h"

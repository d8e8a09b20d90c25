// A compiled module's registration table: (FFI target name, XLA_FFI_Handler*)
// for each handler it exports. The table is the only list of a module's
// target names; Python reads it through the module's handlers().
#ifndef BATCHPART_COMMON_HANDLER_TABLE_H_
#define BATCHPART_COMMON_HANDLER_TABLE_H_

#include <string>
#include <utility>
#include <vector>

namespace batchpart {

using HandlerTable = std::vector<std::pair<std::string, void*>>;

}  // namespace batchpart

#endif  // BATCHPART_COMMON_HANDLER_TABLE_H_

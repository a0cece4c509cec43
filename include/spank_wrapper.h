/* bindgen reads this header: it pulls in the installed Slurm headers so the
 * plugin's version symbols and FFI types match the Slurm it is built for. */
#include <slurm/slurm_version.h>
#include <slurm/spank.h>

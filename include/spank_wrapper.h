/* bindgen reads this header: it pulls in the installed Slurm headers so the
 * plugin's version symbols, step id constants and SPANK types match the Slurm
 * it is built for. */
#include <slurm/slurm_version.h>
#include <slurm/slurm.h>
#include <slurm/spank.h>

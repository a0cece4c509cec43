//! The image a step runs: the tag that submission resolved to a digest
//! (carried to every step in the job's environment), so that all steps and
//! nodes of a job run the same image.

use crate::reference::{ImageRef, ImageSource};

/// The job environment variable carrying the pin: `AS_GIVEN PINNED` (image
/// references never contain spaces). A `SLURM_` name because Slurm hands
/// `SLURM_*` variables of srun's and sbatch's environment to every step, also
/// with `--export=NONE`.
pub const PIN_VARIABLE: &str = "SLURM_SPANK_BERTH_IMAGE_PIN";

/// The pinned reference in `variable` (a [`PIN_VARIABLE`] value) when it
/// was made for exactly the text `image` and names the same registry,
/// repository and user with a digest; `None` otherwise.
pub fn pin_for(image: &str, variable: Option<&str>) -> Option<String> {
    let (given, pinned) = variable?.split_once(' ')?;
    if given != image {
        return None;
    }
    let Ok(ImageSource::Registry(wanted)) = ImageSource::parse(image) else {
        return None;
    };
    let got = ImageRef::parse(pinned).ok()?;
    let same = got.digest.is_some()
        && got.registry == wanted.registry
        && got.repository == wanted.repository
        && got.user == wanted.user
        && (wanted.digest.is_none() || wanted.digest == got.digest);
    same.then(|| pinned.to_string())
}

/// The image a step pulls: the pinned reference when the job environment's
/// [`PIN_VARIABLE`] holds one for this exact `image` text, else `image`.
pub fn for_step(image: &str, variable: Option<&str>) -> String {
    pin_for(image, variable).unwrap_or_else(|| image.to_string())
}

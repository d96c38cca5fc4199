"""What a CI pipeline needs around a cluster: images as files for a cache
(images_io.py), a batch job whose exit code is the step's (submit.py), the evidence
when something failed (logs.py), and versions (version.py: hp's and Python's;
image_versions.py: the images' and Slurm's)."""

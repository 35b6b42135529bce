"""The line-offset index of a meta file: the scan, the build, the cache file and its lock, the index of
an object in a bucket, and the fingerprints of a file's ends."""

"""hybridcache.core"""

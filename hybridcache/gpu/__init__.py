"""hybridcache.gpu"""

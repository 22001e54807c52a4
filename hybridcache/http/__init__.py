"""hybridcache.http"""

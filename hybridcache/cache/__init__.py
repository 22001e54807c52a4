"""hybridcache.cache"""

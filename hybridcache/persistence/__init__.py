"""hybridcache.persistence"""

"""hybridcache.tools"""

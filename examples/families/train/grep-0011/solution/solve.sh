#!/bin/bash
grep warn items.txt > final.txt

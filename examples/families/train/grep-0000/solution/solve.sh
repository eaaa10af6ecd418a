#!/bin/bash
grep warn lines.txt > final.txt

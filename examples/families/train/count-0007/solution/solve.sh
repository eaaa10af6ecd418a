#!/bin/bash
wc -l < list.txt > total.txt

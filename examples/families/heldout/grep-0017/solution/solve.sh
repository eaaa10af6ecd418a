#!/bin/bash
grep ok items.txt > total.txt
